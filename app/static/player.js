// The synced player of the rater page: the body of gr.HTML's js_on_load (element, trigger,
// props, watch are Gradio's). The value is the study service's view of the rater: {progress,
// trial, completion_code} from the load and answer events, plus notice / error / fatal. One
// trial at a time, one stream per trial: its videos are tiles of one H.264 file, played by one
// hidden <video> (or, for a lossless study, one animated lossless WebP: frameSource below, the
// same interface from one frame clock); each box is a <canvas> that draws its tile (trial.tiles[slot] = [x, y, w, h])
// from the same decoded frame, so the boxes are in sync by construction; frame step; swapping
// any two boxes in place; a magnifier (2x / 4x, pixel-exact: every box the same place of the
// same frame); flicker (two boxes' tiles alternated in one place); boxes laid out at their
// tiles' aspect (fit); answers enabled after one play-through; keys on a keyboard, buttons on
// a touch screen. Everything added acts on every box alike (nothing differs by answer).
// Server data is only ever set as text or attributes, never as HTML.
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
let replies = 0, acked = false, firstFrameMs = NaN;
// magnifier: the factor (1: off) and the point it centres on, in tile pixels (one for every box)
const ZOOMS = [1, 2, 4];
let zoom = 1, focus = null;
// flicker: the two slots alternated in one box (null: off), and changes a second
let flicker = null, flickRate = 4, flickBox = null;

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
  aim(cv);
  boxes.push({slot: slot, canvas: cv, ctx: cv.getContext("2d"), rect: rect, drawn: null});
  return c;
}

// the part of a w x h tile a box shows: all of it, or, magnified, the (w / zoom) x (h / zoom)
// pixels around the focus (whole pixels, inside the tile), drawn zoom x zoom each
function view(w, h) {
  if (zoom === 1) return {x: 0, y: 0, w: w, h: h};
  const sw = Math.ceil(w / zoom), sh = Math.ceil(h / zoom), f = focus || {x: w / 2, y: h / 2};
  const x = Math.min(w - sw, Math.max(0, Math.round(f.x - w / (2 * zoom))));
  const y = Math.min(h - sh, Math.max(0, Math.round(f.y - h / (2 * zoom))));
  return {x: x, y: y, w: sw, h: sh};
}

// a click or tap on any box centres the magnifier there (in every box); a drag pans it
function aim(cv) {
  let down = null;
  const at = (e) => {                     // the tile pixel under the pointer
    const r = cv.getBoundingClientRect(), s = Math.min(r.width / cv.width, r.height / cv.height);
    const px = (e.clientX - r.left - (r.width - cv.width * s) / 2) / s;
    const py = (e.clientY - r.top - (r.height - cv.height * s) / 2) / s;
    const v = view(cv.width, cv.height);
    return {x: v.x + px / zoom, y: v.y + py / zoom};
  };
  cv.addEventListener("pointerdown", (e) => {
    if (zoom === 1) return;
    down = {x: e.clientX, y: e.clientY, moved: false, at: at(e),
            focus: focus || {x: cv.width / 2, y: cv.height / 2}};
    cv.setPointerCapture(e.pointerId);
  });
  cv.addEventListener("pointermove", (e) => {
    if (!down) return;
    const r = cv.getBoundingClientRect(), s = Math.min(r.width / cv.width, r.height / cv.height);
    const dx = (e.clientX - down.x) / s / zoom, dy = (e.clientY - down.y) / s / zoom;
    if (!down.moved && Math.hypot(e.clientX - down.x, e.clientY - down.y) < 6) return;
    down.moved = true;
    focus = clampFocus({x: down.focus.x - dx, y: down.focus.y - dy}); draw();
  });
  const up = () => {
    if (down && !down.moved) { focus = clampFocus(down.at); draw(); }
    down = null;
  };
  cv.addEventListener("pointerup", up);
  cv.addEventListener("pointercancel", () => { down = null; });
}
function clampFocus(f) {
  const r = boxes.length ? boxes[0].rect : [0, 0, 1, 1];
  return {x: Math.min(r[2], Math.max(0, f.x)), y: Math.min(r[3], Math.max(0, f.y))};
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

// The play-through gate's acknowledgement (issue 44): once the page received the whole media
// file `name`, it tells the server its size and CRC-32 (POST api/ack), counted over the bytes
// as they arrived (both deliveries play while the file arrives); the server checks them
// against what it sent and starts the play-through clock. Retried a few times (the server may
// not have recorded the last bytes sent yet); resolves true once accepted.
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

// The trial's one stream (never shown itself: the boxes draw its tiles). Fetched once as a
// stream: the bytes received are counted (size and CRC-32) and acknowledged once the last one
// arrived (the gate counts bytes the page holds, not bytes sent), and meanwhile fed to the
// <video> through MediaSource as they arrive (mp4Feed), so the first frame shows as soon as the
// index and the first key frame are in. Where MediaSource is missing or the file cannot be fed
// (an index after the media data), the video plays from the whole file once it arrived.
function stream(name) {
  const v = document.createElement("video");
  v.muted = true; v.loop = true; v.playsInline = true; v.preload = "auto";
  v.className = "ek-source"; v.setAttribute("aria-hidden", "true");
  // relative: the page may sit under a path prefix; the token is the page's own
  const token = new URLSearchParams(location.search).get("token") || "";
  const url = "media/" + encodeURIComponent(name) + "?token=" + encodeURIComponent(token);
  const ctrl = new AbortController();
  v.stopLoad = () => ctrl.abort();
  const feed = mp4Feed(v);                 // sets the video's source at once
  (async () => {
    const res = await fetch(url, {signal: ctrl.signal, cache: "no-store"});
    if (!res.ok || !res.body) throw new Error("media HTTP " + res.status);
    const reader = res.body.getReader(), parts = [];
    let size = 0, crc = 0;
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      if (videos[0] !== v) { ctrl.abort(); return; }          // the trial changed meanwhile
      size += value.byteLength; crc = crc32Update(crc, value); parts.push(value);
      if (feed) feed.push(value);
    }
    if (videos[0] !== v) return;
    // the play-through is counted from the accepted acknowledgement, as the server counts it
    acknowledgeSum(name, size, crc).then((ok) => { if (ok && videos[0] === v) acked = true; });
    if (!feed || !feed.end()) {             // no MediaSource, or the file could not be fed
      if (v.src.startsWith("blob:")) URL.revokeObjectURL(v.src);
      v.src = URL.createObjectURL(new Blob(parts, {type: "video/mp4"}));
    }
    if (playing) v.play().catch(() => {});
  })().catch(() => { if (videos[0] === v) message("The video could not be loaded; please reload the page."); });
  const redraw = () => draw();
  v.addEventListener("seeked", redraw); v.addEventListener("loadeddata", redraw);
  if (v.requestVideoFrameCallback) {
    const onFrame = () => { if (videos[0] === v) { draw(); v.requestVideoFrameCallback(onFrame); } };
    v.requestVideoFrameCallback(onFrame);
  }
  return v;
}

// An MP4 whose index (moov) comes before its media data, fed to video `v` through MediaSource
// as its bytes arrive: the index is rewritten as a fragmented MP4's initialisation segment (the
// same sample description) and each run of samples whose bytes are all in becomes one fragment
// (moof + mdat: the samples' own bytes, durations and key-frame flags, untouched), so the
// decoder gets exactly the bytes of the file. push(bytes) as they arrive; end() once all have:
// false where the feed failed (then the caller plays the whole file instead). null where the
// browser has no MediaSource.
const COLR = [6, 6, 6];                       // primaries, transfer, matrix (ISO 23091-2)
function mp4Feed(v) {
  if (typeof MediaSource === "undefined") return null;
  const ms = new MediaSource();
  let data = new Uint8Array(1 << 20), have = 0, index = null, sb = null, next = 0, seq = 1;
  let failed = false, ended = false, opened = false;
  v.src = URL.createObjectURL(ms);
  const u32 = (b, i) => ((b[i] << 24) | (b[i + 1] << 16) | (b[i + 2] << 8) | b[i + 3]) >>> 0;
  const type = (b, i) => String.fromCharCode(b[i], b[i + 1], b[i + 2], b[i + 3]);
  function boxes(b, start, end) {          // [type, start, end, header] of each box
    const out = [];
    for (let i = start; i + 8 <= end;) {
      let size = u32(b, i), hdr = 8;
      if (size === 1) { size = u32(b, i + 8) * 4294967296 + u32(b, i + 12); hdr = 16; }
      else if (size === 0) size = end - i;
      if (size < hdr || i + size > end) break;
      out.push([type(b, i + 4), i, i + size, hdr]); i += size;
    }
    return out;
  }
  const find = (b, list, t) => list.find((x) => x[0] === t);
  const kids = (b, box, skip = 0) => boxes(b, box[1] + box[3] + skip, box[2]);
  function make(t, ...parts) {
    const n = 8 + parts.reduce((s, p) => s + p.length, 0), out = new Uint8Array(n);
    new DataView(out.buffer).setUint32(0, n);
    for (let k = 0; k < 4; k++) out[4 + k] = t.charCodeAt(k);
    let o = 8;
    for (const p of parts) { out.set(p, o); o += p.length; }
    return out;
  }
  function ints(...xs) {                   // big-endian 32-bit words
    const out = new Uint8Array(4 * xs.length), d = new DataView(out.buffer);
    xs.forEach((x, k) => d.setUint32(4 * k, x >>> 0));
    return out;
  }
  function parse(moov, ftyp) {             // the index of the file's one video track
    const b = data, top = kids(b, moov);
    const trak = find(b, top, "trak"), mvhd = find(b, top, "mvhd");
    const tk = kids(b, trak), tkhd = find(b, tk, "tkhd"), mdia = find(b, tk, "mdia");
    const md = kids(b, mdia), mdhd = find(b, md, "mdhd"), hdlr = find(b, md, "hdlr");
    const minf = find(b, md, "minf"), mi = kids(b, minf), stbl = find(b, mi, "stbl");
    const st = kids(b, stbl), get = (t) => find(b, st, t);
    const stsd = get("stsd"), stts = get("stts"), stsc = get("stsc"), stsz = get("stsz");
    const stco = get("stco") || get("co64"), stss = get("stss");
    if (get("ctts") || !stsd || !stts || !stsc || !stsz || !stco) throw new Error("index");
    const tv = b[tkhd[1] + 8], trackId = u32(b, tkhd[1] + 8 + (tv === 1 ? 20 : 12));
    const avc1 = kids(b, stsd, 8)[0], avcC = find(b, boxes(b, avc1[1] + 8 + 78, avc1[2]), "avcC");
    if (!avcC) throw new Error("codec");
    const p = avcC[1] + 8, hex = (x) => x.toString(16).padStart(2, "0");
    const codec = "avc1." + hex(b[p + 1]) + hex(b[p + 2]) + hex(b[p + 3]);
    const n = u32(b, stsz[1] + 16), fixed = u32(b, stsz[1] + 12);
    const sizes = [], offsets = [], times = [], durs = [], sync = new Set();
    for (let k = 0; k < n; k++) sizes.push(fixed || u32(b, stsz[1] + 20 + 4 * k));
    let t = 0;
    for (let e = 0, ne = u32(b, stts[1] + 12); e < ne; e++) {
      const c = u32(b, stts[1] + 16 + 8 * e), d = u32(b, stts[1] + 20 + 8 * e);
      for (let k = 0; k < c; k++) { times.push(t); durs.push(d); t += d; }
    }
    const co64 = stco[0] === "co64", nc = u32(b, stco[1] + 12);
    const chunk = (c) => co64 ? u32(b, stco[1] + 16 + 8 * c) * 4294967296 + u32(b, stco[1] + 20 + 8 * c)
                              : u32(b, stco[1] + 16 + 4 * c);
    const runs = [];
    for (let e = 0, ne = u32(b, stsc[1] + 12); e < ne; e++)
      runs.push([u32(b, stsc[1] + 16 + 12 * e) - 1, u32(b, stsc[1] + 20 + 12 * e)]);
    let s = 0;
    for (let r = 0; r < runs.length; r++) {
      const endChunk = r + 1 < runs.length ? runs[r + 1][0] : nc;
      for (let c = runs[r][0]; c < endChunk; c++) {
        let o = chunk(c);
        for (let k = 0; k < runs[r][1] && s < n; k++, s++) { offsets.push(o); o += sizes[s]; }
      }
    }
    if (stss) for (let e = 0, ne = u32(b, stss[1] + 12); e < ne; e++) sync.add(u32(b, stss[1] + 16 + 4 * e) - 1);
    else for (let k = 0; k < n; k++) sync.add(k);
    if (offsets.length !== n || times.length !== n) throw new Error("index");
    const raw = (x) => b.slice(x[1], x[2]);
    const empty = (t, words) => make(t, ints(0, ...words));
    // the sample description with the colours the whole-file path assumes for a stream that
    // names none (an explicit 'colr': without it MediaSource decodes such a stream with other
    // colours than the same file played whole, measured up to 7 code values)
    const entry = boxes(b, avc1[1] + 8 + 78, avc1[2]);
    const colr = find(b, entry, "colr") ? [] : [make("colr", new Uint8Array([110, 99, 108, 120,
      0, COLR[0], 0, COLR[1], 0, COLR[2], 0]))];
    const sd = make("stsd", ints(0, 1), make("avc1", b.slice(avc1[1] + 8, avc1[1] + 8 + 78),
                                             ...entry.map(raw), ...colr));
    const init = [raw(ftyp), make("moov", raw(mvhd),
      make("trak", raw(tkhd), make("mdia", raw(mdhd), raw(hdlr), make("minf",
        ...mi.filter((x) => x[0] !== "stbl").map(raw),
        make("stbl", sd, empty("stts", [0]), empty("stsc", [0]), empty("stsz", [0, 0]),
             empty("stco", [0]))))),
      make("mvex", make("trex", ints(0, trackId, 1, 0, 0, 0))))];
    return {trackId, codec, sizes, offsets, times, durs, sync, n, init};
  }
  function fragment(a, z) {                // samples a..z-1 as one moof + mdat
    const ix = index, m = z - a, words = [];
    for (let k = a; k < z; k++)
      words.push(ix.durs[k], ix.sizes[k], ix.sync.has(k) ? 0x02000000 : 0x01010000);
    const trunSize = 8 + 12 + 12 * m, moofSize = 8 + 16 + 8 + 16 + 20 + trunSize;
    const base = ix.times[a];
    const moof = make("moof", make("mfhd", ints(0, seq++)),
      make("traf", make("tfhd", ints(0x020000, ix.trackId)),
           make("tfdt", ints(0x01000000, Math.floor(base / 4294967296), base >>> 0)),
           make("trun", ints(0x000701, m, moofSize + 8, ...words))));
    let total = 0;
    for (let k = a; k < z; k++) total += ix.sizes[k];
    const body = new Uint8Array(total);
    for (let k = a, o = 0; k < z; k++) { body.set(data.subarray(ix.offsets[k], ix.offsets[k] + ix.sizes[k]), o); o += ix.sizes[k]; }
    return [moof, make("mdat", body)];
  }
  let pending = [];
  function pump() {
    if (failed || !sb || sb.updating) return;
    if (!pending.length && index) {
      let z = next;
      while (z < index.n && index.offsets[z] + index.sizes[z] <= have) z++;
      if (z > next) { pending = fragment(next, z); next = z; }
    }
    if (pending.length) {
      const part = pending.shift();
      try { sb.appendBuffer(part); } catch (e) { failed = true; }
      return;
    }
    if (ended && index && next >= index.n && ms.readyState === "open") {
      try { ms.endOfStream(); } catch (e) { /* closed meanwhile */ }
    }
  }
  function tryIndex() {                    // the index, once ftyp and moov are all in
    if (index || failed) return;
    let moov = null, ftyp = null;
    for (let i = 0; i + 8 <= have && !(moov && ftyp);) {
      let size = u32(data, i), hdr = 8;
      const t = type(data, i + 4);
      if (size === 1) {
        if (i + 16 > have) return;
        size = u32(data, i + 8) * 4294967296 + u32(data, i + 12); hdr = 16;
      }
      // the media data before the index (or a box to the end of the file): played whole
      if (t === "mdat" || size < hdr) { failed = true; return; }
      if (i + size > have) return;          // the rest of this box has not arrived yet
      if (t === "moov") moov = [t, i, i + size, hdr];
      if (t === "ftyp") ftyp = [t, i, i + size, hdr];
      i += size;
    }
    if (!moov || !ftyp) return;
    try { index = parse(moov, ftyp); } catch (e) { failed = true; return; }
    if (!MediaSource.isTypeSupported('video/mp4; codecs="' + index.codec + '"')) { failed = true; return; }
    if (opened) start();
  }
  function start() {
    if (!index || sb || failed) return;
    try {
      sb = ms.addSourceBuffer('video/mp4; codecs="' + index.codec + '"');
      sb.mode = "segments";
    } catch (e) { failed = true; return; }
    sb.addEventListener("updateend", pump);
    sb.addEventListener("error", () => { failed = true; });
    const init = new Uint8Array(index.init[0].length + index.init[1].length);
    init.set(index.init[0]); init.set(index.init[1], index.init[0].length);
    pending = [init];
    pump();
  }
  ms.addEventListener("sourceopen", () => { opened = true; start(); }, {once: true});
  return {
    push(bytes) {
      if (have + bytes.length > data.length) {
        const grown = new Uint8Array(Math.max(data.length * 2, have + bytes.length));
        grown.set(data.subarray(0, have)); data = grown;
      }
      data.set(bytes, have); have += bytes.length;
      tryIndex(); pump();
    },
    end() { ended = true; tryIndex(); pump(); return !failed && !!index; },
  };
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

// one tile of the current frame into a canvas: 1:1, or magnified (the tile drawn 1:1 into a
// scratch canvas, then the part in view scaled by a whole factor with no smoothing: each pixel
// becomes zoom x zoom identical pixels)
let scratch = null;
function paint(ctx, img, r) {
  if (zoom === 1) { ctx.drawImage(img, r[0], r[1], r[2], r[3], 0, 0, r[2], r[3]); return; }
  if (!scratch) scratch = document.createElement("canvas");
  if (scratch.width !== r[2] || scratch.height !== r[3]) { scratch.width = r[2]; scratch.height = r[3]; }
  const s = scratch.getContext("2d");
  s.drawImage(img, r[0], r[1], r[2], r[3], 0, 0, r[2], r[3]);
  const v = view(r[2], r[3]);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(scratch, v.x, v.y, v.w, v.h, 0, 0, v.w * zoom, v.h * zoom);
}

// every box from the one current frame of the stream (and the flicker box: the tile of one of
// its two slots, which one by the page's clock at flickRate changes a second)
function draw() {
  const v = videos[0];
  if (!v || v.readyState < 2) return;
  const t = v.isFrameSource ? v.frameIndex() / FPS : v.currentTime;
  const img = v.isFrameSource ? v.image() : v;
  if (!img) return;
  for (const b of boxes) {
    if (flicker) { b.drawn = t; continue; }   // hidden meanwhile, still on the clock
    paint(b.ctx, img, b.rect);
    b.drawn = t;
  }
  if (flicker && flickBox) {
    const slot = flicker[Math.floor(performance.now() * flickRate / 1000) % 2];
    const b = boxes.find((x) => x.slot === slot);
    if (b) {
      paint(flickBox.ctx, img, b.rect);
      flickBox.canvas.dataset.showing = slot; flickBox.label.textContent = SLOT_LABELS[slot] || slot;
      flickBox.drawn = t;
    }
  }
  if (firstFrameMs !== firstFrameMs) firstFrameMs = performance.now() - shownAt;
}

function stopVideos() {
  videos.forEach((v) => {
    if (v.isFrameSource) { v.close(); return; }
    if (v.stopLoad) v.stopLoad();
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
  flickBox = null; flicker = null; focus = null; firstFrameMs = NaN;
  const fp = $("flicker-pair"); fp.replaceChildren();
  flickerPairs().forEach((p, i) => {
    const o = document.createElement("option");
    o.value = String(i); o.textContent = p.join(" / ");
    fp.appendChild(o);
  });
  fp.hidden = fp.options.length < 2;
  $("stage").classList.remove("flickering");
  $("btn-flicker").setAttribute("aria-pressed", "false");
  setZoom(1);
  $("trial").hidden = false; $("done").hidden = true;
  document.body.dataset.trialIndex = String(t.index);
  shownAt = performance.now();
  fit();
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

// the magnifier: 1x, 2x, 4x, off again (every box alike, around one focus)
function setZoom(z) {
  zoom = z;
  const btn = $("btn-zoom");
  btn.textContent = "Zoom " + zoom + "\u00d7";
  btn.setAttribute("aria-pressed", String(zoom > 1));
  $("stage").classList.toggle("magnified", zoom > 1);
  draw();
}
function toggleZoom() { setZoom(ZOOMS[(ZOOMS.indexOf(zoom) + 1) % ZOOMS.length]); }

// flicker: one box in the place of all, showing the chosen pair's tiles in turn
function flickerPairs() {
  return cur ? (SWAPS[cur.protocol] || []).map((s) => [s[0], s[1]]) : [];
}
function setFlicker(on) {
  const stage = $("stage");
  if (flickBox) { flickBox.cell.remove(); flickBox = null; }
  const pairs = flickerPairs(), pick = Number($("flicker-pair").value) || 0;
  flicker = on && pairs.length ? pairs[Math.min(pick, pairs.length - 1)] : null;
  stage.classList.toggle("flickering", !!flicker);
  $("btn-flicker").setAttribute("aria-pressed", String(!!flicker));
  if (flicker) {
    const r = boxes.find((b) => b.slot === flicker[0]).rect;
    const c = document.createElement("div");
    c.className = "cell flick";
    const l = document.createElement("div");
    l.className = "label"; l.textContent = SLOT_LABELS[flicker[0]] || flicker[0];
    const cv = document.createElement("canvas");
    cv.width = r[2]; cv.height = r[3]; cv.className = "flicker";
    c.appendChild(l); c.appendChild(cv); stage.appendChild(c);
    aim(cv);
    flickBox = {cell: c, canvas: cv, ctx: cv.getContext("2d"), label: l, drawn: null};
  }
  fit(); draw();
}

// lay the boxes out at their tiles' aspect, as large as the stage allows: of every number of
// columns, the one that gives the largest scale (side by side on a wide screen, stacked on a
// phone held upright); each canvas gets that size exactly, so a clip of any aspect is shown
// whole, neither stretched nor cropped, and no box carries bars of its own
function fit() {
  const stage = $("stage");
  if (!cur || !boxes.length || stage.clientWidth === 0) return;
  const shown = flickBox ? [flickBox.canvas] : boxes.map((b) => b.canvas);
  const n = shown.length, w = shown[0].width, h = shown[0].height, gap = 8;
  const label = (flickBox ? flickBox.label : boxes[0].canvas.previousSibling).offsetHeight;
  const W = stage.clientWidth, H = stage.clientHeight;
  let best = {s: -1, c: 1};
  for (let c = 1; c <= n; c++) {
    const r = Math.ceil(n / c);
    const s = Math.min((W - gap * (c - 1)) / (c * w), (H - gap * (r - 1) - r * label) / (r * h));
    if (s > best.s + 1e-9) best = {s: s, c: c};
  }
  const s = Math.max(best.s, 0);
  stage.style.gridTemplateColumns = "repeat(" + best.c + ", max-content)";
  for (const cv of shown) {
    cv.style.width = Math.max(1, Math.floor(w * s)) + "px";
    cv.style.height = Math.max(1, Math.floor(h * s)) + "px";
  }
}
if (typeof ResizeObserver !== "undefined") new ResizeObserver(() => fit()).observe($("stage"));
window.addEventListener("resize", () => fit());

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
$("btn-flicker").addEventListener("click", () => setFlicker(!flicker));
$("flicker-pair").addEventListener("change", () => { if (flicker) setFlicker(true); });
$("flicker-rate").addEventListener("change", () => { flickRate = Number($("flicker-rate").value) || 4; });
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
  if (k === "k") { setFlicker(!flicker); return; }
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
  acked: acked, zoom: zoom, view: view(b.rect[2], b.rect[3]), firstFrameMs: firstFrameMs,
  flicker: flicker ? flicker.slice() : null, flickRate: flickRate}; });
window.evalkitState = () => ({replies: replies, state: last ? JSON.parse(JSON.stringify(last)) : null});

watch("value", () => render(props.value));
if (props.value) render(props.value);
