// The synced player of the rater page: the body of gr.HTML's js_on_load (element, trigger,
// props, watch are Gradio's). The value is the study service's view of the rater: {progress,
// trial, completion_code} from the load and answer events, plus notice / error / fatal. One
// trial at a time, one stream per trial: its videos are tiles of one H.264 file, played by one
// hidden <video> (or, for a lossless study, one animated lossless WebP: frameSource below, the
// same interface from one frame clock); each box is a <canvas> that draws its tile (trial.tiles[slot] = [x, y, w, h])
// from the same decoded frame, so the boxes are in sync by construction; frame step; swapping
// any two boxes in place; zoom; answers enabled after one play-through; keys on a keyboard,
// buttons on a touch screen. Server data is only ever set as text or attributes, never as HTML.
const DEFAULT_FPS = 24, STEP_EPS = 0.001, REPLY_TIMEOUT_MS = 20000;
let FPS = DEFAULT_FPS, FRAME = 1 / FPS;
const LABELS = {left: "Left", right: "Right", same: "No difference", A: "A is X", B: "B is X"};
const SLOT_LABELS = {X: "X (reference)", A: "A", B: "B", left: "Left", right: "Right"};
const SWAPS = {preference: [["left", "right", "f"]],
               abx: [["X", "A", "f"], ["X", "B", "g"], ["A", "B", "h"]]};
const KEYS = {
  preference: {"1": "left", "ArrowLeft": "left", "2": "right", "ArrowRight": "right",
               "3": "same", "ArrowDown": "same", "s": "same"},
  abx: {"a": "A", "1": "A", "b": "B", "2": "B"},
};
const root = element.querySelector(".ek");
const $ = (id) => element.querySelector("#" + id);
let cur = null, videos = [], boxes = [], watched = 0, lastTick = null, shownAt = 0, busy = false;
let playing = true, enabled = false, swapped = null, nonce = 0, waiting = null, last = null;
let replies = 0, acked = false;

function message(text) { const m = $("message"); m.textContent = text || ""; m.hidden = !text; }

function setProgress(p) {
  if (!p) return;
  element.querySelector(".ek-progress").hidden = false;
  $("progress").max = p.total; $("progress").value = p.done;
  $("progress-text").textContent = p.done + " of " + p.total + " answered";
}

function showHelp(on) {
  $("instructions").hidden = !on;
  $("btn-help").setAttribute("aria-expanded", String(on));
}

// one box: a label and a canvas the size of its tile
function cell(slot, rect, i) {
  const c = document.createElement("div");
  c.className = "cell"; c.dataset.slot = slot; c.style.order = String(i);
  const l = document.createElement("div");
  l.className = "label"; l.textContent = SLOT_LABELS[slot] || slot;
  const cv = document.createElement("canvas");
  cv.dataset.slot = slot; cv.width = rect[2]; cv.height = rect[3];
  c.appendChild(l); c.appendChild(cv);
  boxes.push({slot: slot, canvas: cv, ctx: cv.getContext("2d"), rect: rect, drawn: null});
  return c;
}

// CRC-32 (IEEE, as Python's zlib.crc32) of a whole media file
const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = (c & 1) ? (0xEDB88320 ^ (c >>> 1)) : (c >>> 1);
    t[n] = c >>> 0;
  }
  return t;
})();
// running form: c = crc32Update(0, chunk1); c = crc32Update(c, chunk2) ... equals crc32(all)
function crc32Update(crc, bytes) {
  let c = (crc ^ 0xFFFFFFFF) >>> 0;
  for (let i = 0; i < bytes.length; i++) c = CRC_TABLE[(c ^ bytes[i]) & 0xFF] ^ (c >>> 8);
  return (c ^ 0xFFFFFFFF) >>> 0;
}
function crc32(bytes) { return crc32Update(0, bytes); }

// The play-through gate's acknowledgement (issue 44): once the page holds the whole media
// file `name`, it tells the server its size and CRC-32 (POST api/ack); the server checks them
// against what it sent and starts the play-through clock. Any delivery path calls this with
// the file's bytes once they have all arrived (acknowledge), or with their size and CRC-32
// counted as they arrived (acknowledgeSum: the lossless path, which never holds the whole
// file). Retried a few times (the server may not have recorded the last bytes sent yet);
// resolves true once accepted.
function acknowledge(name, bytes) { return acknowledgeSum(name, bytes.length, crc32(bytes)); }
async function acknowledgeSum(name, size, crc) {
  const token = new URLSearchParams(location.search).get("token") || "";
  const body = JSON.stringify({token: token, media: name, size: size, crc32: crc});
  for (let i = 0; i < 5; i++) {
    try {
      const r = await fetch("api/ack", {method: "POST", body: body,
                                        headers: {"Content-Type": "application/json"}});
      if (r.ok) return true;
      if (r.status === 404) return false;      // no longer this rater's trial
    } catch (e) { /* the server is away: try again */ }
    await new Promise((res) => setTimeout(res, 100 * 2 ** i));
  }
  return false;
}

// the trial's one stream (never shown itself: the boxes draw its tiles): the whole file is
// fetched, acknowledged (the gate counts bytes the page holds, not bytes sent), then played
function stream(name) {
  const v = document.createElement("video");
  v.muted = true; v.loop = true; v.playsInline = true; v.preload = "auto";
  v.className = "ek-source"; v.setAttribute("aria-hidden", "true");
  // relative: the page may sit under a path prefix; the token is the page's own
  const token = new URLSearchParams(location.search).get("token") || "";
  const url = "media/" + encodeURIComponent(name) + "?token=" + encodeURIComponent(token);
  fetch(url).then((r) => {
    if (!r.ok) throw new Error("media HTTP " + r.status);
    return r.arrayBuffer();
  }).then((buf) => {
    if (videos[0] !== v) return;              // the trial changed meanwhile
    // the play-through is counted from the accepted acknowledgement, as the server counts it
    acknowledge(name, new Uint8Array(buf)).then((ok) => { if (ok && videos[0] === v) acked = true; });
    v.src = URL.createObjectURL(new Blob([buf], {type: "video/mp4"}));
    if (playing) v.play().catch(() => {});
  }).catch(() => message("The video could not be loaded; please reload the page."));
  const redraw = () => draw();
  v.addEventListener("seeked", redraw); v.addEventListener("loadeddata", redraw);
  if (v.requestVideoFrameCallback) {
    const onFrame = () => { if (videos[0] === v) { draw(); v.requestVideoFrameCallback(onFrame); } };
    v.requestVideoFrameCallback(onFrame);
  }
  return v;
}

// a lossless trial (an animated lossless WebP): fetched as a stream and decoded with WebCodecs'
// ImageDecoder as its bytes arrive (frame 0 shows before the file has all arrived); what the
// player uses of a <video> (currentTime, duration, paused, readyState, play, pause, loop,
// playbackRate), from one clock at the study's frame rate: frame k is shown from k / FPS on.
// The clock waits (readyState 2) while the next frame is not decoded. Decoded frames are kept
// around the playhead only (a memory budget), decoded ahead in order, one at a time. The
// bytes received are counted (size and CRC-32) on the fetch's other branch; once the last one
// arrived they are acknowledged as media file `name` (the play-through gate opens only then;
// the frames already show while the file arrives).
const FRAME_BUDGET = 400e6;                  // bytes of decoded frames kept (RGBA)
function frameSource(url, name) {
  const src = {currentTime: 0, paused: true, loop: true, playbackRate: 1, readyState: 0,
               duration: NaN, isFrameSource: true, remove() {}, received: 0, complete: false};
  const cache = new Map();                   // frame index -> VideoFrame
  let dec = null, count = 0, busy = false, keep = 8, last = null, gone = false, wanted = 0;
  const ctrl = new AbortController();
  const index = () => Math.floor(src.currentTime * FPS + 1e-6);
  src.image = () => cache.get(Math.min(index(), Math.max(0, count - 1)));
  src.frameIndex = () => Math.min(index(), Math.max(0, count - 1));
  function ready() {
    const k = src.frameIndex();
    if (!cache.has(k)) return 1;
    const n = src.complete ? (k + 1) % count : k + 1;
    return (cache.has(n) || (src.complete && !src.loop && n >= count)) ? 4 : 2;
  }
  function evict(k) {
    for (const [i, f] of cache) {
      const ahead = (i - k + count) % Math.max(1, count);
      if (ahead >= keep) { f.close(); cache.delete(i); }
    }
  }
  async function pump() {                    // decode the next frame wanted, one at a time
    if (busy || gone || !dec) return;
    const k = src.frameIndex();
    let next = -1;
    for (let j = 0; j < keep; j++) {
      const i = src.complete ? (k + j) % count : k + j;
      if (!cache.has(i) && (src.complete ? true : i < count)) { next = i; break; }
    }
    if (next < 0) return;
    busy = true;
    try {
      const r = await dec.decode({frameIndex: next});
      if (gone || cache.has(next)) { r.image.close(); if (gone) return; }
      else cache.set(next, r.image);
      evict(src.frameIndex());
    } catch (e) {                            // not decodable yet: tried again shortly
      busy = false;
      if (!gone) setTimeout(pump, 50);
      return;
    }
    busy = false;
    src.readyState = ready();
    pump();
  }
  src.tick = (now) => {                      // the one clock: advanced by the page's loop
    if (!src.paused && last !== null && src.readyState >= 3) {
      let t = src.currentTime + (now - last) / 1000 * src.playbackRate;
      if (src.complete && src.duration && t >= src.duration) {
        if (src.loop) t = t % src.duration; else { t = src.duration - 1 / FPS; src.paused = true; }
      } else if (!src.complete && t * FPS >= count) t = Math.max(0, count - 1) / FPS;
      src.currentTime = t;
    }
    last = src.paused ? null : now;
    src.readyState = ready();
    pump();
  };
  src.play = () => { src.paused = false; return Promise.resolve(); };
  src.pause = () => { src.paused = true; };
  Object.defineProperty(src, "seekTo", {value: (t) => {
    src.currentTime = Math.max(0, t); src.readyState = ready(); evict(src.frameIndex()); pump();
  }});
  src.close = () => {
    gone = true; ctrl.abort();
    cache.forEach((f) => f.close()); cache.clear();
    if (dec) { try { dec.close(); } catch (e) { /* closed */ } }
  };
  (async () => {
    try {
      const res = await fetch(url, {signal: ctrl.signal, cache: "no-store"});
      if (!res.ok || !res.body || typeof ImageDecoder === "undefined") throw new Error("load");
      const [mine, theirs] = res.body.tee();
      dec = new ImageDecoder({data: theirs, type: "image/webp", colorSpaceConversion: "none",
                              premultiplyAlpha: "none"});
      const reader = mine.getReader();     // bytes received (the decoder reads its own copy)
      (async () => {
        let crc = 0;
        for (;;) {
          const {done, value} = await reader.read();
          if (done) break;
          src.received += value.byteLength; crc = crc32Update(crc, value);
        }
        if (gone || videos[0] !== src) return; // the trial changed meanwhile
        // the play-through is counted from the accepted acknowledgement, as the server counts it
        const ok = await acknowledgeSum(name, src.received, crc);
        if (ok && videos[0] === src) acked = true;
      })().catch(() => {});
      await dec.tracks.ready;
      const track = dec.tracks.selectedTrack;
      const poll = setInterval(() => {
        if (gone) { clearInterval(poll); return; }
        count = track.frameCount; pump();
      }, 50);
      dec.completed.then(() => {
        clearInterval(poll);
        if (gone) return;
        count = track.frameCount; src.complete = true; src.duration = count / FPS;
        pump();
      }).catch(() => {});
      count = track.frameCount;
      await dec.decode({frameIndex: 0}).then((r) => {
        if (gone) { r.image.close(); return; }
        const f = r.image;
        if (cache.has(0)) { cache.get(0).close(); }
        keep = Math.max(3, Math.floor(FRAME_BUDGET / (4 * f.displayWidth * f.displayHeight)));
        cache.set(0, f); count = Math.max(count, 1); src.readyState = ready(); pump();
      });
    } catch (e) {
      if (!gone) message("This trial's media could not be loaded; please reload the page.");
    }
  })();
  return src;
}

// every box from the one current frame of the stream
function draw() {
  const v = videos[0];
  if (!v || v.readyState < 2) return;
  const t = v.isFrameSource ? v.frameIndex() / FPS : v.currentTime;
  const img = v.isFrameSource ? v.image() : v;
  if (!img) return;
  for (const b of boxes) {
    const r = b.rect;
    b.ctx.drawImage(img, r[0], r[1], r[2], r[3], 0, 0, r[2], r[3]);
    b.drawn = t;
  }
}

function stopVideos() {
  videos.forEach((v) => {
    if (v.isFrameSource) { v.close(); return; }
    v.pause();
    if (v.src.startsWith("blob:")) URL.revokeObjectURL(v.src);
    v.removeAttribute("src"); v.load(); v.remove();
  });
  videos = []; boxes = [];
}

function finish(state) {
  cur = null; stopVideos();
  $("trial").hidden = true; $("done").hidden = false; showHelp(false);
  $("done-text").textContent = "You answered all " + state.progress.total + " trials.";
  if (state.completion_code) {
    $("code").textContent = state.completion_code; $("code-wrap").hidden = false;
  }
  document.body.dataset.finished = "1";
}

function renderTrial(t) {
  stopVideos();
  cur = t;
  FPS = (typeof t.fps === "number" && isFinite(t.fps) && t.fps > 0) ? t.fps : DEFAULT_FPS;
  FRAME = 1 / FPS;
  root.dataset.protocol = t.protocol;
  const order = t.protocol === "abx" ? ["X", "A", "B"] : ["left", "right"];
  const stage = $("stage");
  stage.replaceChildren(...order.filter((s) => s in t.tiles).map((s, i) => cell(s, t.tiles[s], i)));
  stage.dataset.count = String(stage.children.length);
  const name = Object.values(t.media)[0];
  let v;
  if (name.endsWith(".webp")) {
    const token = new URLSearchParams(location.search).get("token") || "";
    v = frameSource("media/" + encodeURIComponent(name) + "?token=" + encodeURIComponent(token), name);
  } else {
    v = stream(name);
    root.appendChild(v);
  }
  videos = [v];
  const swaps = $("swaps"); swaps.replaceChildren();
  for (const [a, b, k] of SWAPS[t.protocol] || []) {
    const btn = document.createElement("button");
    btn.type = "button"; btn.dataset.swap = a + "-" + b; btn.setAttribute("aria-pressed", "false");
    btn.textContent = t.protocol === "abx" ? a + " \u21c4 " + b : "Swap";
    btn.title = "swap " + a + " and " + b + " in place (" + k.toUpperCase() + ")";
    btn.addEventListener("click", () => toggleSwap(a, b));
    swaps.appendChild(btn);
  }
  const answers = $("answers"); answers.replaceChildren();
  for (const a of t.answers) {
    const b = document.createElement("button");
    b.type = "button"; b.className = "answer"; b.dataset.answer = a; b.disabled = true;
    b.textContent = LABELS[a] || a;
    b.addEventListener("click", () => answer(a));
    answers.appendChild(b);
  }
  watched = 0; lastTick = null; enabled = false; acked = false; playing = true; busy = false; swapped = null;
  $("watch-hint").hidden = false;
  $("btn-play").textContent = "Pause";
  root.classList.remove("zoom"); $("btn-zoom").setAttribute("aria-pressed", "false");
  $("trial").hidden = false; $("done").hidden = true;
  document.body.dataset.trialIndex = String(t.index);
  shownAt = performance.now();
  videos.forEach((v) => v.play().catch(() => {}));
}

// a reply of the service: a new trial, the same trial (an error to show), or the end
function render(state) {
  if (!state || typeof state !== "object") return;
  replies += 1; last = state;
  if (waiting) { clearTimeout(waiting); waiting = null; }
  if (state.fatal) { cur = null; stopVideos(); $("trial").hidden = true; message(state.fatal); return; }
  setProgress(state.progress);
  if (!("trial" in state)) {              // refused: the trial stays, the answers come back
    message(state.error ? "Your answer was not saved: " + state.error : "");
    busy = false;
    if (enabled) setTimeout(enableAnswers, Math.max(0, state.wait_ms || 0));
    return;
  }
  message(state.notice || "");
  if (!state.trial) { finish(state); return; }
  if (!cur && state.progress && state.progress.done === 0 && replies === 1) showHelp(true);
  if (cur && cur.trial === state.trial.trial) { busy = false; if (enabled) enableAnswers(); return; }
  renderTrial(state.trial);
}

function enableAnswers() {
  enabled = true; $("watch-hint").hidden = true;
  element.querySelectorAll("#answers button").forEach((b) => { b.disabled = busy; });
}

// one loop draws the boxes and counts the play-through (one stream: nothing to keep in sync)
function tick(now) {
  if (!element.isConnected) return;
  if (videos.length) {
    const m = videos[0];
    if (m.isFrameSource) m.tick(now);
    draw();
    // counted only while the stream can play on (HAVE_FUTURE_DATA): playback starts before the
    // whole file has arrived, and a stall waiting for bytes is not watching
    if (playing && acked && !m.paused && m.readyState >= 3) {
      if (lastTick !== null) watched += (now - lastTick) / 1000 * m.playbackRate;
      if (!enabled && m.duration && watched >= m.duration) enableAnswers();
    }
    lastTick = (playing && acked && !m.paused) ? now : null;
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
  }
}

function seekTo(t) {
  if (!videos.length) return;
  setPlaying(false);
  videos.forEach((v) => { if (v.isFrameSource) v.seekTo(t); else v.currentTime = t; });
}
// frame step: land just after the start of the target frame; never past the last frame's
// start (a seek into the last frame's span can end playback, or wrap it when looping)
function step(n) {
  if (!videos.length) return;
  const d = videos[0].duration || 0, lastFrame = d ? Math.max(0, Math.round(d * FPS) - 1) : Infinity;
  const now = Math.min(lastFrame, Math.floor(videos[0].currentTime * FPS + 1e-3));
  const k = Math.min(lastFrame, Math.max(0, now + n));
  if (k === now && !playing) return;
  seekTo(k * FRAME + STEP_EPS);
}

// swap two boxes in place (their cells exchange grid positions; playback goes on)
function toggleSwap(a, b) {
  const key = a + "-" + b, on = swapped !== key;
  const cells = Array.from($("stage").children);
  cells.forEach((c, i) => { c.style.order = String(i); });
  if (on) {
    const ca = cells.find((c) => c.dataset.slot === a), cb = cells.find((c) => c.dataset.slot === b);
    if (!ca || !cb) return;
    const o = ca.style.order; ca.style.order = cb.style.order; cb.style.order = o;
  }
  swapped = on ? key : null;
  element.querySelectorAll("#swaps button").forEach((x) => {
    x.setAttribute("aria-pressed", String(x.dataset.swap === swapped));
  });
}

function toggleZoom() {
  const on = !root.classList.contains("zoom");
  root.classList.toggle("zoom", on);
  $("btn-zoom").setAttribute("aria-pressed", String(on));
}

function answer(a) {
  if (!cur || !enabled || busy) return;
  busy = true;
  element.querySelectorAll("#answers button").forEach((b) => { b.disabled = true; });
  nonce += 1;
  trigger("answer", {trial: cur.trial, answer: a, response_ms: Math.round(performance.now() - shownAt),
                     nonce: nonce});
  // no reply (the server is gone): say so and let the rater try again
  waiting = setTimeout(() => {
    waiting = null; busy = false; enableAnswers();
    message("No answer from the server yet; please check your connection and try again.");
  }, REPLY_TIMEOUT_MS);
}

$("btn-play").addEventListener("click", () => setPlaying(!playing));
$("btn-back").addEventListener("click", () => step(-1));
$("btn-fwd").addEventListener("click", () => step(1));
$("btn-zoom").addEventListener("click", toggleZoom);
$("btn-help").addEventListener("click", () => showHelp($("instructions").hidden));
$("btn-close-help").addEventListener("click", () => showHelp(false));
document.addEventListener("keydown", (e) => {
  if (!cur || e.ctrlKey || e.metaKey || e.altKey) return;
  const tag = (e.target && e.target.tagName) || "";
  if (tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT") return;
  const k = e.key.length === 1 ? e.key.toLowerCase() : e.key;
  if (k === " ") { e.preventDefault(); setPlaying(!playing); return; }
  if (k === ",") { step(-1); return; }
  if (k === ".") { step(1); return; }
  if (k === "z") { toggleZoom(); return; }
  const sw = (SWAPS[cur.protocol] || []).find((s) => s[2] === k);
  if (sw) { toggleSwap(sw[0], sw[1]); return; }
  const a = (KEYS[cur.protocol] || {})[k];
  if (a) { e.preventDefault(); answer(a); }
});

// test hooks (read-only): per box, the stream time of the frame it shows, and the stream's
// state; and the last reply of the service
window.evalkitPlayers = () => boxes.map((b) => { const v = videos[0]; return {slot: b.slot,
  t: b.drawn === null ? NaN : b.drawn, paused: v.paused, ready: v.readyState,
  duration: v.duration, fps: FPS, streams: videos.length, lossless: !!v.isFrameSource,
  received: v.isFrameSource ? v.received : null, complete: v.isFrameSource ? v.complete : null,
  acked: acked}; });
window.evalkitState = () => ({replies: replies, state: last ? JSON.parse(JSON.stringify(last)) : null});

watch("value", () => render(props.value));
if (props.value) render(props.value);
