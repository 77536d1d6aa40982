// Rater page: one trial at a time from /api/trial; synced looping players, frame step,
// flicker (swap in place), zoom, answers enabled after one play-through, keyboard shortcuts.
// Everything shown comes from the server; server data is only ever set as text, never HTML.
(function () {
  "use strict";
  // the study's frame rate comes with each trial (studies made before it was stored: 24)
  const DEFAULT_FPS = 24, STEP_EPS = 0.001;
  let FPS = DEFAULT_FPS, FRAME = 1 / FPS;
  const token = new URLSearchParams(location.search).get("token") || "";
  const LABELS = {left: "Left", right: "Right", same: "No difference", A: "A is X", B: "B is X"};
  const KEYS = {
    preference: {"1": "left", "ArrowLeft": "left", "2": "right", "ArrowRight": "right",
                 "3": "same", "ArrowDown": "same", "s": "same"},
    abx: {"a": "A", "1": "A", "b": "B", "2": "B"},
  };
  const $ = (id) => document.getElementById(id);
  let cur = null, videos = [], watched = 0, lastTick = null, shownAt = 0, busy = false;
  let playing = true, enabled = false;

  function message(text) { const m = $("message"); m.textContent = text || ""; m.hidden = !text; }

  async function call(url, opts) {
    const r = await fetch(url, Object.assign({cache: "no-store", referrerPolicy: "no-referrer"}, opts || {}));
    let body = {};
    try { body = await r.json(); } catch (e) { body = {error: "unexpected answer from the server"}; }
    if (!r.ok) { const e = new Error(body.error || ("error " + r.status)); e.status = r.status; throw e; }
    return body;
  }

  function setProgress(p) {
    $("progress-wrap").hidden = false;
    $("progress").max = p.total; $("progress").value = p.done;
    $("progress-text").textContent = p.done + " of " + p.total + " answered";
  }

  function videoEl(slot, name) {
    const v = document.createElement("video");
    v.muted = true; v.loop = true; v.playsInline = true; v.preload = "auto"; v.autoplay = true;
    v.dataset.slot = slot;
    v.src = "/media/" + encodeURIComponent(name) + "?token=" + encodeURIComponent(token);
    return v;
  }

  function cell(slot, name, label) {
    const c = document.createElement("div");
    c.className = "cell"; c.dataset.slot = slot;
    const l = document.createElement("div");
    l.className = "label"; l.textContent = label;
    c.appendChild(l); c.appendChild(videoEl(slot, name));
    return c;
  }

  function render(state) {
    setProgress(state.progress);
    stopVideos();
    if (!state.trial) { finish(state); return; }
    const t = state.trial;
    cur = t;
    FPS = (typeof t.fps === "number" && isFinite(t.fps) && t.fps > 0) ? t.fps : DEFAULT_FPS;
    FRAME = 1 / FPS;
    for (const p of ["preference", "abx"]) {
      $("instr-" + p).hidden = p !== t.protocol; $("keys-" + p).hidden = p !== t.protocol;
    }
    const stage = $("stage"); stage.replaceChildren();
    let pair;
    if (t.protocol === "abx") {
      const top = document.createElement("div"); top.className = "row single";
      top.appendChild(cell("X", t.media.X, "X (reference)"));
      pair = document.createElement("div"); pair.className = "row pair";
      pair.appendChild(cell("A", t.media.A, "A")); pair.appendChild(cell("B", t.media.B, "B"));
      stage.appendChild(top); stage.appendChild(pair);
    } else {
      pair = document.createElement("div"); pair.className = "row pair";
      pair.appendChild(cell("left", t.media.left, "Left"));
      pair.appendChild(cell("right", t.media.right, "Right"));
      stage.appendChild(pair);
    }
    videos = Array.from(stage.querySelectorAll("video"));
    const answers = $("answers"); answers.replaceChildren();
    for (const a of t.answers) {
      const b = document.createElement("button");
      b.type = "button"; b.className = "answer"; b.dataset.answer = a; b.disabled = true;
      b.textContent = LABELS[a] || a;
      b.addEventListener("click", () => answer(a));
      answers.appendChild(b);
    }
    watched = 0; lastTick = null; enabled = false; playing = true; busy = false;
    $("watch-hint").hidden = false;
    setFlicker(false);
    $("btn-play").textContent = "Pause";
    $("trial").hidden = false; $("done").hidden = true;
    document.body.dataset.trialIndex = String(t.index);
    shownAt = performance.now();
    videos.forEach((v) => v.play().catch(() => {}));
  }

  function finish(state) {
    cur = null;
    $("trial").hidden = true; $("done").hidden = false; $("instructions").open = false;
    $("done-text").textContent = "You answered all " + state.progress.total + " trials.";
    if (state.completion_code) { $("code").textContent = state.completion_code; $("code-wrap").hidden = false; }
    document.body.dataset.finished = "1";
  }

  function stopVideos() {
    videos.forEach((v) => { v.pause(); v.removeAttribute("src"); v.load(); });
    videos = [];
  }

  function enableAnswers() {
    enabled = true; $("watch-hint").hidden = true;
    document.querySelectorAll("#answers button").forEach((b) => { b.disabled = false; });
  }

  // one loop drives sync and the play-through count: followers snap to the first video
  function tick(now) {
    if (videos.length) {
      const m = videos[0];
      if (playing && !m.paused && m.readyState >= 2) {
        if (lastTick !== null) watched += (now - lastTick) / 1000 * m.playbackRate;
        for (const o of videos.slice(1)) {
          if (o.paused) o.play().catch(() => {});
          if (Math.abs(o.currentTime - m.currentTime) > FRAME / 2) o.currentTime = m.currentTime;
        }
        if (!enabled && m.duration && watched >= m.duration) enableAnswers();
      }
      lastTick = (playing && !m.paused) ? now : null;
    }
    requestAnimationFrame(tick);
  }
  requestAnimationFrame(tick);

  function setPlaying(on) {
    if (!videos.length) return;
    playing = on;
    $("btn-play").textContent = on ? "Pause" : "Play";
    // paused players do not loop: with loop set, Chromium wraps a seek near the end to 0
    videos.forEach((v) => { v.loop = on; });
    if (on) { videos.forEach((v) => v.play().catch(() => {})); }
    else {
      videos.forEach((v) => v.pause());
      const t = videos[0].currentTime;
      videos.slice(1).forEach((v) => { v.currentTime = t; });
    }
  }

  function seekTo(t) {
    if (!videos.length) return;
    setPlaying(false);
    videos.forEach((v) => { v.currentTime = t; });
  }
  // frame step: land just after the start of the target frame; never past the last frame's
  // start (a seek into the last frame's span can end playback, or wrap it when looping)
  // (Chromium may still report such a seek as the end: the last frame stays on screen)
  function step(n) {
    if (!videos.length) return;
    const d = videos[0].duration || 0, last = d ? Math.max(0, Math.round(d * FPS) - 1) : Infinity;
    const cur = Math.min(last, Math.floor(videos[0].currentTime * FPS + 1e-3));
    const k = Math.min(last, Math.max(0, cur + n));
    if (k === cur && !playing) return;
    seekTo(k * FRAME + STEP_EPS);
  }

  function setFlicker(on) {
    const pair = document.querySelector(".row.pair");
    if (pair) pair.classList.toggle("swapped", on);
    $("btn-flicker").setAttribute("aria-pressed", String(on));
  }
  function toggleFlicker() {
    setFlicker($("btn-flicker").getAttribute("aria-pressed") !== "true");
  }
  function toggleZoom() {
    const on = !document.body.classList.contains("zoom");
    document.body.classList.toggle("zoom", on);
    $("btn-zoom").setAttribute("aria-pressed", String(on));
  }

  async function answer(a) {
    if (!cur || !enabled || busy) return;
    busy = true;
    document.querySelectorAll("#answers button").forEach((b) => { b.disabled = true; });
    const ms = Math.round(performance.now() - shownAt);
    try {
      const state = await call("/api/answer", {method: "POST",
        headers: {"Content-Type": "application/json"},
        body: JSON.stringify({token: token, trial: cur.trial, answer: a, response_ms: ms})});
      message(""); render(state);
    } catch (e) {
      if (e.status === 409) {
        // answered meanwhile in another tab or on another device: go on with the current trial
        try {
          const state = await call("/api/trial?token=" + encodeURIComponent(token));
          busy = false; render(state);
          message("This trial was already answered (in another tab or on another device); " +
                  "here is the next one.");
          return;
        } catch (e2) { e = e2; }
      }
      message("Your answer could not be saved: " + e.message + ". Please try again.");
      busy = false; enableAnswers();
    }
  }

  $("btn-play").addEventListener("click", () => setPlaying(!playing));
  $("btn-back").addEventListener("click", () => step(-1));
  $("btn-fwd").addEventListener("click", () => step(1));
  $("btn-flicker").addEventListener("click", toggleFlicker);
  $("btn-zoom").addEventListener("click", toggleZoom);
  document.addEventListener("keydown", (e) => {
    if (!cur || e.ctrlKey || e.metaKey || e.altKey) return;
    const k = e.key.length === 1 ? e.key.toLowerCase() : e.key;
    if (k === " ") { e.preventDefault(); setPlaying(!playing); return; }
    if (k === ",") { step(-1); return; }
    if (k === ".") { step(1); return; }
    if (k === "f") { toggleFlicker(); return; }
    if (k === "z") { toggleZoom(); return; }
    const a = (KEYS[cur.protocol] || {})[k];
    if (a) { e.preventDefault(); answer(a); }
  });

  // test hook: the sync state of the players (read-only)
  window.evalkitPlayers = () => videos.map((v) => ({slot: v.dataset.slot, t: v.currentTime,
    paused: v.paused, ready: v.readyState, duration: v.duration, fps: FPS}));

  async function start() {
    if (!token) { message("This page needs the invite link you were given (it has a token)."); return; }
    try { render(await call("/api/trial?token=" + encodeURIComponent(token))); }
    catch (e) { message("This invite link is not valid: " + e.message); }
  }
  start();
})();
