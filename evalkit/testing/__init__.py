"""Shared test support, importable by tests, benchmarks and users' own tests (no ``sys.path``
edits): fake renderers (``evalkit.testing.renderers:Invert`` as a ``-r`` path), the renderers
of the Ray tests, tiny diffusers pipelines built from configs (random weights, no download), a
compare report for study tests, and the real ``evalkit serve`` as a process on loopback.
What it imports beyond evalkit's runtime dependencies (transformers and tokenizers, for the
tiny pipelines) comes with ``pip install 'evalkit[test]'``.

- :mod:`.renderers`: ``Invert`` and friends (a fake transport for the render harness)
- :mod:`.ray_renderers`: renderers whose workers can be found and killed
- :mod:`.tiny_v2v`, :mod:`.tiny_animatediff`, :mod:`.tiny_families`: tiny video-to-video pipelines
  (``tiny_families``: Wan, Wan VACE, CogVideoX, LTX-Video, SkyReels-V2 from diffusers' test
  configurations, or at their published dimensions for benchmarks)
- :mod:`.studies`: ``make_report`` and a browser-like rater (``answer``, ``current``, ``progress``)
- :mod:`.server`: ``Server`` (``evalkit serve`` on a free port), ``free_port``
- :mod:`.page`: driving the rater page from Playwright (``open_page``, ``answer``, ``boxes``)
- :mod:`.gradio_client`: ``GradioRater``, the rater page's Gradio events without a browser
- :mod:`.kills`: raters answering while the server is SIGKILLed
- :mod:`.suites`: ``write_suite``, a one-clip suite file
"""
