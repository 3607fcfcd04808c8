// One job: timeline (Gantt), learners, loss/metric curves per attempt, checkpoints, why pending, log tail.
import { api, follow, stream } from "./api.js";
import { actionsFor } from "./actions.js";
import { colour, debounce, h, keepingFocus, STATE_COLOURS, stateBadge, table, time } from "./dom.js";

const TERMINAL = new Set(["COMPLETED", "FAILED", "CANCELLED"]);
const LOG_LINES = 400;

function gantt(job) {
  const history = job.history;
  const end = TERMINAL.has(job.state) ? Date.parse(job.updated_at) : Date.now();
  const start = Date.parse(history[0].at);
  const total = Math.max(1, end - start);
  const bars = history.map((entry, i) => {
    const from = Date.parse(entry.at);
    const to = i + 1 < history.length ? Date.parse(history[i + 1].at) : end;
    const width = TERMINAL.has(entry.state) && i + 1 === history.length ? 4 : Math.max(0.6, (100 * (to - from)) / total);
    const text = `${entry.state} from ${time(entry.at)} for ${((to - from) / 1000).toFixed(1)}s` + (entry.reason ? `: ${entry.reason}` : "");
    return h("span", { tabindex: 0, role: "img", title: text, "aria-label": text, "data-state": entry.state,
      style: { flex: `${width} 0 0`, background: STATE_COLOURS[entry.state] || "#888" } }, entry.state);
  });
  const seen = [...new Set(history.map((e) => e.state))];
  const strip = h("div", { class: "gantt", id: "gantt", "aria-label": "Timeline of states" }, bars);
  // a bar too narrow for its state's name shows none (the legend and its hover name it): a cut
  // name ("UNCHI") reads as a word that is not there; measured again when the strip's width changes
  new ResizeObserver(() => fitLabels(strip)).observe(strip);
  return h("div", {}, strip,
    h("div", { class: "gantt-legend" }, seen.map((s) => h("span", {}, h("span", { class: "swatch", style: { background: STATE_COLOURS[s] } }), s))),
    h("p", { class: "muted" }, `${job.restarts} restart(s), attempt ${job.attempt}. Hover or focus a bar for its reason.`));
}

// A checkpoint's URI as a table shows it: a file:// one by its file's name (its directory is the
// job's, the same for every row), any other whole; the cell's title holds the whole URI.
const shortUri = (uri) => (uri.startsWith("file://") ? `…/${uri.split("/").filter(Boolean).at(-1)}` : uri);

function fitLabels(strip) {
  for (const bar of strip.children) {
    bar.textContent = bar.dataset.state;
    if (bar.scrollWidth > bar.clientWidth) bar.textContent = "";
  }
}

// The latest value of a series (a legend shows it while no point is hovered, not "--").
function latest(values) {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] != null) return values[i];
  return null;
}

// Metric curves: x = step; one series per (metric, attempt); markers at checkpoints and restarts.
class Curves {
  constructor(target) {
    this.target = target;
    this.points = new Map(); // "metric|attempt" -> Map(step -> value)
    this.checkpoints = new Set();
    this.restarts = new Set();
    this.plot = null;
    this.keys = "";
    this.redraw = debounce(() => this.draw(), 100);
    // the chart follows its box's width (a window resized, a phone turned)
    new ResizeObserver(debounce(() => this.plot?.setSize({ width: this.width(), height: 240 }), 100)).observe(target);
  }
  width() { return Math.max(240, this.target.clientWidth || 600); }
  progress(data) {
    if (data.rank !== 0) return;
    for (const [metric, value] of Object.entries(data.metrics || {})) {
      const key = `${metric}|${data.attempt}`;
      if (!this.points.has(key)) {
        this.points.set(key, new Map());
        if (data.attempt > 1) this.restarts.add(data.step);
      }
      this.points.get(key).set(data.step, value);
    }
    this.redraw();
  }
  checkpoint(step) { this.checkpoints.add(step); this.redraw(); }
  count() { let n = 0; for (const m of this.points.values()) n += m.size; return n; }
  draw() {
    this.target.dataset.points = String(this.count());
    if (!this.points.size) { this.target.replaceChildren(h("p", { class: "muted" }, "No progress reported yet.")); this.plot = null; return; }
    const keys = [...this.points.keys()].sort();
    const steps = [...new Set([...this.points.values()].flatMap((m) => [...m.keys()]))].sort((a, b) => a - b);
    const data = [steps, ...keys.map((k) => steps.map((s) => this.points.get(k).get(s) ?? null))];
    if (this.plot && keys.join() === this.keys) { this.plot.setData(data); return; }
    this.keys = keys.join();
    const marks = () => [[this.checkpoints, "#1e7f3c", [2, 3]], [this.restarts, "#c46a00", [6, 3]]];
    this.target.replaceChildren();
    this.plot = new uPlot({
      width: this.width(), height: 240,
      scales: { x: { time: false } },
      axes: [{ label: "step" }, {}],
      series: [{ label: "step" }, ...keys.map((k) => {
        const [metric, attempt] = k.split("|");
        return { label: `${metric} (attempt ${attempt})`, stroke: colour(k), spanGaps: true, points: { show: true, size: 4 },
          // the hovered step's value; with none hovered (or none at that step), the series' latest
          value: (u, value, series) => {
            const shown = value ?? latest(u.data[series]);
            return shown == null ? "—" : String(Number(shown.toPrecision(4)));
          } };
      })],
      hooks: { draw: [(u) => {
        const ctx = u.ctx;
        for (const [steps, stroke, dash] of marks()) {
          for (const step of steps) {
            const x = u.valToPos(step, "x", true);
            ctx.save(); ctx.strokeStyle = stroke; ctx.setLineDash(dash); ctx.lineWidth = 1.5; ctx.beginPath();
            ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke(); ctx.restore();
          }
        }
      }] },
    }, data, this.target);
  }
}

export async function jobPage(jobId, { main, signal }) {
  const id = encodeURIComponent(jobId);
  let job = await api(`/v1/jobs/${id}`);
  const alert = h("div", { class: "alert", role: "alert" });
  const head = h("div", {}), timeline = h("div", {}), learners = h("div", {}), why = h("div", {}), checkpoints = h("div", {});
  const chart = h("div", { class: "chart", id: "curves", "data-points": "0" });
  // shown only while the job waits: a running job is not "pending", and a card saying so is noise
  const whyCard = h("section", { class: "card", id: "why-card", "aria-labelledby": "wp", hidden: true },
    h("h2", { id: "wp" }, "Why pending"), why);
  const rank = h("select", { id: "log-rank", "aria-label": "Learner" });
  const log = h("pre", { class: "log", id: "log", tabindex: 0, "aria-label": "Log tail" });
  main.append(h("h1", {}, jobId), alert, head,
    h("section", { class: "card", "aria-labelledby": "tl" }, h("h2", { id: "tl" }, "Timeline"), timeline),
    h("section", { class: "card", "aria-labelledby": "cv" }, h("h2", { id: "cv" }, "Loss and metrics"),
      h("p", { class: "muted" }, "Per attempt, by step; dashed lines: checkpoints (green) and restarts (orange)."), chart),
    h("div", { class: "grid2" },
      h("section", { class: "card", "aria-labelledby": "ln" }, h("h2", { id: "ln" }, "Learners"), learners),
      whyCard),
    h("section", { class: "card", "aria-labelledby": "ck" }, h("h2", { id: "ck" }, "Checkpoints"), checkpoints),
    h("section", { class: "card", "aria-labelledby": "lg" }, h("div", { class: "row" }, h("h2", { id: "lg" }, "Log"),
      h("label", {}, "Learner", rank)), log));

  const drawJob = () => {
    head.replaceChildren(h("div", { class: "card" },
      h("dl", { class: "kv" },
        h("dt", {}, "State"), h("dd", { id: "job-state", "data-state": job.state }, stateBadge(job.state)),
        h("dt", {}, "Tenant"), h("dd", {}, job.tenant),
        h("dt", {}, "Learners × GPUs"), h("dd", {}, `${job.spec.learners} × ${job.spec.gpus}`),
        h("dt", {}, "Attempt"), h("dd", {}, `${job.attempt} (${job.restarts} restart(s))`),
        // why it is in its state now (the API's reason is the current state's, a queued job's refined
        // by the scheduler's latest word)
        h("dt", {}, "Reason"), h("dd", { id: "job-reason" }, job.reason || "—"),
        job.result ? [h("dt", {}, "Result"), h("dd", {}, JSON.stringify(job.result))] : null),
      h("div", { class: "row", style: { marginTop: "8px" } }, actionsFor(job, alert, () => refresh()))));
    timeline.replaceChildren(gantt(job));
    learners.replaceChildren(table(["Rank", "Status", "Node", "GPUs", "Step", "Heartbeat"], job.learners.map((l) =>
      h("tr", {}, h("td", {}, l.rank), h("td", {}, l.status), h("td", {}, l.node || "—"), h("td", {}, l.gpus.join(", ") || "—"),
        h("td", {}, l.step ?? "—"), h("td", {}, l.heartbeat?.alive ? "alive" : "—")))));
    checkpoints.replaceChildren(job.checkpoints.length
      ? table(["Attempt", "Rank", "Step", "URI", "Size"], job.checkpoints.map((c) => h("tr", {}, h("td", {}, c.attempt),
        h("td", {}, c.rank), h("td", {}, c.step), h("td", { class: "uri", title: c.uri }, shortUri(c.uri)),
        h("td", {}, c.size_bytes))))
      : h("p", { class: "muted" }, "None yet."));
  };
  const draw = async () => {
    keepingFocus(main, drawJob);
    const pending = job.state === "QUEUED" || job.state === "SUBMITTED";
    whyCard.hidden = !pending;
    if (pending) {
      const answer = await api(`/v1/jobs/${id}/why`);
      why.replaceChildren(h("p", { id: "why" }, answer.summary),
        answer.position ? h("p", { class: "muted" }, `Position ${answer.position} of ${answer.queue_length}; ` +
          `${answer.tenant_position} within ${answer.tenant}, which holds ${answer.tenant_gpus_held} GPU(s)` +
          ((answer.tenant_counts_as_gpus ?? answer.tenant_gpus_held) !== answer.tenant_gpus_held ?
            `, counted as ${answer.tenant_counts_as_gpus} against its quota (CPUs and memory too).` : ".")) : null);
    }
    const ranks = job.learners.map((l) => String(l.rank));
    if ([...rank.options].map((o) => o.value).join() !== ranks.join()) {
      rank.replaceChildren(...ranks.map((r) => h("option", { value: r }, `rank ${r}`)));
    }
  };
  let whenDrawn = () => {};
  // Answers can arrive out of order: one older than the job drawn is dropped, never drawn over it.
  const refresh = debounce(async () => {
    try {
      const fresh = await api(`/v1/jobs/${id}`);
      if (fresh.updated_at < job.updated_at) return;
      job = fresh;
      await draw();
      whenDrawn();
    } catch (error) { if (!signal.aborted) alert.textContent = error.message; }
  }, 150);
  await draw();

  const curves = new Curves(chart);
  curves.draw();
  follow(`/v1/jobs/${id}/events?follow=true`, (message) => {
    const event = JSON.parse(message.data);
    if (event.type === "LearnerProgressed") curves.progress(event.data);
    else if (event.type === "CheckpointRecorded") curves.checkpoint(event.data.checkpoint.step);
    else refresh();
  }, signal).then(refresh) // the stream ends once the job has ended: draw its last state
    .catch((error) => { alert.textContent = error.message; });

  // A learner's log exists once it has been launched: follow it from then on, again on a new attempt.
  let tail = null, following = "";
  const followLog = async () => {
    tail?.abort();
    tail = new AbortController();
    const mine = tail;
    signal.addEventListener("abort", () => mine.abort());
    following = `${job.attempt}|${rank.value}`;
    log.textContent = "";
    try {
      await stream(`/v1/jobs/${id}/logs?rank=${rank.value || 0}&follow=true&tail=${LOG_LINES}`, (text) => {
        const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
        log.textContent = (log.textContent + text).split("\n").slice(-LOG_LINES).join("\n");
        if (atBottom) log.scrollTop = log.scrollHeight;
      }, mine.signal);
    } catch (error) {
      if (!mine.signal.aborted) log.textContent = `(${error.message})`;
    }
  };
  const launched = () => job.attempt >= 1 && !["SUBMITTED", "QUEUED", "SCHEDULED", "LAUNCHING"].includes(job.state);
  whenDrawn = () => { if (launched() && following !== `${job.attempt}|${rank.value}`) followLog(); };
  rank.addEventListener("change", followLog);
  if (launched()) followLog();
  else log.textContent = "(no log until the job is launched)";
}
