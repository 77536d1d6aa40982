"""The Gradio app (rater and admin pages). A thin layer over ``evalkit.study``; built in a later issue."""
