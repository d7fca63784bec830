// The live view: the server's state from /v1/events (pushed a few times a second, one stream per
// page, closed while the page is hidden): each request's states over the last 30 s as a timeline
// with parks and resumes marked, the requests now in the server with their prompt progress, the
// KV pool, the prefix cache's hit rate, the token rates and speculative decoding's drafts kept.

import { api, keyChanged, NeedKey, serverEvents } from "./api.js";

const WINDOW_S = 60; // the longest history kept and shown
const MIN_WINDOW_S = 5; // the timeline spans its requests' history, at least this long
const HZ = 4;
const LANE = 20; // px per request in the timeline
const AXIS = 18; // px under the lanes for the time axis
const LABEL = 44; // px left of the lanes for the request's number
const SVG = "http://www.w3.org/2000/svg";

export class LiveView {
  constructor(onLink, watched = () => null) {
    this.onLink = onLink; // (state, text) of the events connection, for the header
    this.watched = watched; // the model watched on a server of several (null: the first one)
    this.history = new Map(); // request id -> {id, engine, spans: [{state, t0, t1}], marks: [{kind, t}], parks, lastSeen, gone}
    this.lastT = null;
    this.controller = null;
    this.svg = document.getElementById("timeline");
    this.rows = document.getElementById("request-rows");
    document.addEventListener("visibilitychange", () => (document.hidden ? this.close() : this.connect()));
    window.addEventListener("resize", () => this.drawTimeline());
  }

  close() {
    if (this.controller) this.controller.abort();
    this.controller = null;
  }

  // another model chosen: its state from now on, the timeline started afresh
  watch() {
    this.close();
    this.history.clear();
    this.lastT = null;
    this.connect();
  }

  // keeps one events stream open while the page is visible; reconnects after a failure
  async connect() {
    if (this.controller || document.hidden) return;
    const controller = (this.controller = new AbortController());
    while (this.controller === controller) {
      try {
        const model = this.watched();
        const query = model === null ? "" : `&model=${encodeURIComponent(model)}`;
        const response = await api(`/v1/events?hz=${HZ}${query}`, { signal: controller.signal });
        if (response.status === 409) { // the chosen model is not loaded yet (its first request loads it)
          this.onLink("down", `${model}: not loaded`);
          await new Promise((resolve) => setTimeout(resolve, 2000));
          continue;
        }
        if (!response.ok) throw new Error(`${response.status}`);
        for await (const { event, data } of serverEvents(response)) {
          if (event !== "state") continue;
          this.onLink("live", "live");
          this.update(JSON.parse(data));
        }
        throw new Error("the stream ended");
      } catch (e) {
        if (this.controller !== controller) return; // closed on purpose
        if (e instanceof NeedKey) {
          this.onLink("key", "API key needed");
          await keyChanged();
        } else {
          this.onLink("down", "server unreachable");
          await new Promise((resolve) => setTimeout(resolve, 2000));
        }
      }
    }
  }

  update(msg) {
    const t = msg.t;
    const seen = new Set();
    for (const r of msg.requests) {
      seen.add(r.id);
      let h = this.history.get(r.id);
      if (!h) {
        h = { id: r.id, engine: r.engine, spans: [{ state: r.state, t0: t, t1: t }], marks: [], parks: 0 };
        this.history.set(r.id, h);
      } else {
        const last = h.spans.at(-1);
        if (last.state === r.state && !h.gone) last.t1 = t;
        else h.spans.push({ state: r.state, t0: last.t1, t1: t }); // it changed between the two messages
        if (last.state === "parked" && r.state !== "parked") h.marks.push({ kind: "resume", t });
      }
      if (r.parks > h.parks) h.marks.push({ kind: "park", t }); // counted, so a short park between messages shows too
      h.parks = r.parks;
      h.lastSeen = t;
      h.gone = false;
    }
    for (const h of this.history.values()) {
      if (!seen.has(h.id)) h.gone = true;
      if (h.lastSeen < t - WINDOW_S) this.history.delete(h.id);
    }
    this.lastT = t;
    this.multiEngine = msg.engines.length > 1;
    this.drawStats(msg);
    this.drawPool(msg.kv);
    document.getElementById("memory-wait").hidden =
      !(msg.waiting_for_memory || msg.requests.some((r) => r.state === "paused"));
    this.drawRows(msg.requests);
    this.drawTimeline();
  }

  drawStats(msg) {
    const hitRate = msg.kv.prefix_cache?.hit_rate;
    text("stat-prompt", Math.round(msg.rates.prompt_tok_s));
    text("stat-gen", Math.round(msg.rates.generated_tok_s));
    text("stat-hits", hitRate == null ? "–" : `${(100 * hitRate).toFixed(0)}%`);
    text("stat-parks", `${msg.totals.parks} / ${msg.totals.resumes}`);
    text("stat-requests", msg.totals.requests);
    const { drafted, accepted } = msg.totals; // speculative decoding's, since the start (shown once a draft was made)
    document.getElementById("stat-drafts-box").hidden = !drafted;
    if (drafted) text("stat-drafts", `${(100 * accepted / drafted).toFixed(0)}% of ${drafted}`);
  }

  drawPool(kv) {
    const total = kv.kv_blocks || 0;
    const used = kv.used ?? 0;
    const cached = kv.cached ?? 0;
    const free = kv.free ?? Math.max(0, total - used - cached);
    const bar = document.getElementById("kv-bar");
    for (const [name, count] of [["used", used], ["cached", cached], ["free", free]]) {
      bar.querySelector(`.${name}`).style.width = total ? `${(100 * count) / total}%` : "0";
    }
    const summary = `${used} in use · ${cached} cached · ${free} free of ${total} blocks of ${kv.kv_block ?? "?"} tokens`;
    bar.setAttribute("aria-label", `KV pool: ${summary}`);
    text("kv-text", summary);
    const hostRow = document.getElementById("host-row");
    hostRow.hidden = !kv.host_capacity;
    if (kv.host_capacity) text("host-text", `${kv.host_blocks ?? 0} of ${kv.host_capacity} blocks`);
    this.drawExperts(kv.expert_cache);
  }

  drawExperts(cache) {
    // routed experts in host memory behind GPU slots (--gpu-memory, --expert-slots): its counts since the start
    document.getElementById("expert-row").hidden = !cache;
    if (!cache) return;
    const hits = cache.hit_rate == null ? "–" : `${(100 * cache.hit_rate).toFixed(1)}% hits`;
    const perToken = cache.bytes_per_token == null ? "–" : sizeText(cache.bytes_per_token);
    const slots = cache.layers ? Math.round(cache.slots / cache.layers) : cache.slots;
    text("expert-text", `${hits} · ${perToken} copied a token · ${slots} slots a layer × ${cache.layers} layers`);
  }

  drawRows(requests) {
    document.getElementById("idle").hidden = requests.length > 0;
    this.rows.replaceChildren(...requests.map((r) => {
      const row = document.createElement("tr");
      row.dataset.state = r.state;
      row.dataset.id = r.id;
      const progress = Object.assign(document.createElement("progress"), { max: r.prompt_tokens || 1, value: r.done });
      progress.setAttribute("aria-label", `request ${r.id} prompt read`);
      const prompt = document.createElement("td");
      prompt.append(progress, ` ${r.done} / ${r.prompt_tokens}`);
      const state = cell(r.state + (r.in_host ? " (host)" : ""));
      state.className = `state ${r.state}`;
      row.append(cell(this.multiEngine ? `${r.id} · e${r.engine}` : r.id), state, prompt, cell(r.generated),
                 cell(r.parks), cell(`${r.age_s.toFixed(1)} s`));
      return row;
    }));
  }

  drawTimeline() {
    if (this.lastT === null) return;
    const lanes = [...this.history.values()].sort((a, b) => a.id - b.id);
    const earliest = Math.min(this.lastT, ...lanes.map((h) => h.spans[0].t0));
    const span = Math.min(WINDOW_S, Math.max(MIN_WINDOW_S, Math.ceil(this.lastT - earliest + 1)));
    const width = Math.max(200, this.svg.clientWidth || 600);
    const height = Math.max(1, lanes.length) * LANE + AXIS;
    const x = (t) => LABEL + ((t - (this.lastT - span)) / span) * (width - LABEL - 24);
    const shapes = [];
    lanes.forEach((h, i) => {
      const y = i * LANE;
      shapes.push(svg("text", { x: 2, y: y + LANE - 6, class: "lane-label" }, `#${h.id}`));
      for (const s of h.spans) {
        const x0 = Math.max(LABEL, x(s.t0));
        const x1 = Math.max(x0 + 2, x(s.t1)); // a state seen once still shows
        if (x1 <= LABEL) continue;
        const rect = svg("rect", { x: x0, y: y + 3, width: x1 - x0, height: LANE - 6, class: `span ${s.state}` });
        rect.append(svg("title", {}, `#${h.id} ${s.state} ${(s.t1 - s.t0).toFixed(1)} s`));
        shapes.push(rect);
      }
      for (const m of h.marks) {
        if (x(m.t) < LABEL) continue;
        const mark = svg("path", { d: markPath(x(m.t), y, m.kind), class: `mark ${m.kind}` });
        mark.append(svg("title", {}, `#${h.id} ${m.kind === "park" ? "parked" : "resumed"} at ${m.t.toFixed(1)} s`));
        shapes.push(mark);
      }
    });
    const axisY = lanes.length * LANE;
    const step = [1, 2, 5, 10, 15].find((s) => span / s <= 7) || 20;
    for (let ago = 0; ago <= span; ago += step) {
      const tx = x(this.lastT - ago);
      shapes.push(svg("line", { x1: tx, x2: tx, y1: 0, y2: axisY + 4, class: "grid" }));
      shapes.push(svg("text", { x: tx, y: axisY + 15, class: "tick" }, ago === 0 ? "now" : `-${ago}s`));
    }
    this.svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    this.svg.setAttribute("height", height);
    this.svg.replaceChildren(...shapes);
  }
}

function markPath(x, y, kind) {
  // a park: a triangle pointing down above the lane; a resume: one pointing up below it
  return kind === "park" ? `M${x - 5},${y} L${x + 5},${y} L${x},${y + 7} Z`
    : `M${x - 5},${y + LANE} L${x + 5},${y + LANE} L${x},${y + LANE - 7} Z`;
}

function svg(name, attributes, content) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, v);
  if (content !== undefined) node.textContent = content;
  return node;
}

function cell(content) {
  return Object.assign(document.createElement("td"), { textContent: String(content) });
}

function sizeText(bytes) {
  for (const [unit, size] of [["GB", 1e9], ["MB", 1e6], ["kB", 1e3]]) {
    if (bytes >= size) return `${(bytes / size).toFixed(1)} ${unit}`;
  }
  return `${bytes} B`;
}

function text(id, content) {
  document.getElementById(id).textContent = String(content);
}
