// The GPU map (nodes × GPUs, coloured by job or tenant) and the queues, as /v1/timemachine answers them.
import { colour, h, stateBadge, table } from "./dom.js";

export function gpuMap(picture, { byTenant = false } = {}) {
  const tenantOf = new Map(picture.jobs.map((job) => [job.job_id, job.tenant]));
  const seen = new Map();
  const nodes = picture.nodes.map((node) => {
    const marked = node.status !== "READY";
    const cells = [];
    for (let gpu = 0; gpu < node.gpus; gpu++) {
      const holder = node.allocated[String(gpu)];
      let cls = "gpu free", label = "free", fill = null;
      if (holder === "other") { cls = "gpu other"; label = "other"; }
      else if (holder) {
        const key = byTenant ? tenantOf.get(holder) || holder : holder;
        fill = colour(key);
        label = byTenant ? `${key} (${holder})` : holder;
        seen.set(key, fill);
        cls = "gpu held";
      }
      cells.push(h("span", { class: cls, role: "img", "data-holder": holder || "", title: `${node.name} GPU ${gpu}: ${label}`,
        "aria-label": `${node.name} GPU ${gpu}: ${label}`, style: fill ? { background: fill } : null }, String(gpu)));
    }
    return h("div", { class: `node ${node.status}`, "data-node": node.name },
      h("span", { class: "name", title: node.name }, node.name),
      marked ? h("span", { class: "mark", title: node.cordon?.reason || node.reason || "" }, node.status) : null,
      h("span", { class: "gpus" }, cells));
  });
  const legend = h("div", { class: "legend" },
    h("span", {}, h("span", { class: "swatch", style: { background: "var(--free)", border: "1px solid var(--line)" } }), "free"),
    h("span", {}, h("span", { class: "swatch gpu other", style: { width: "12px", height: "12px" } }), "other tenant"),
    [...seen].map(([key, fill]) => h("span", {}, h("span", { class: "swatch", style: { background: fill } }), key)));
  return h("div", {}, h("div", { class: "gpumap", id: "gpumap" }, nodes.length ? nodes : h("p", { class: "muted" }, "No nodes.")), legend);
}

export function queueTable(picture) {
  if (!picture.queue.length) return h("p", { class: "muted" }, "Nothing queued.");
  return table(["#", "Job", "Tenant", "Priority", "Learners × GPUs", "Reason"], picture.queue.map((q) =>
    h("tr", {}, h("td", {}, q.position), h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(q.job_id)}` }, q.job_id)),
      h("td", {}, q.tenant), h("td", {}, q.priority), h("td", {}, `${q.learners} × ${q.gpus}`), h("td", {}, q.reason || ""))));
}

export function tenantTable(picture) {
  if (!picture.tenants.length) return h("p", { class: "muted" }, "No tenant holds or wants GPUs.");
  // "Counts as": GPU-equivalents, what quotas, fair share and borrowing count (a job asking much CPU or
  // memory per GPU counts more than its GPUs); "Borrowed" is in them too.
  return table(["Tenant", "GPUs held", "Counts as", "Queued jobs", "Guaranteed", "Borrowing limit", "Borrowed", "Weight",
    "Fair share"],
    picture.tenants.map((t) => h("tr", {}, h("td", {}, t.tenant), h("td", {}, t.gpus_held), h("td", {}, t.counts_as_gpus),
      h("td", {}, t.queued),
      h("td", {}, t.guaranteed_gpus), h("td", {}, t.borrowing_limit_gpus ?? "any idle"), h("td", {}, t.borrowed),
      h("td", {}, t.weight), h("td", {}, t.fair_share_gpus))));
}

export function jobStates(picture) {
  if (!picture.jobs.length) return h("p", { class: "muted" }, "No jobs yet.");
  return table(["Job", "Tenant", "State", "Attempt", "GPUs held", "Reason"], picture.jobs.map((job) =>
    h("tr", { "data-job": job.job_id, "data-state": job.state },
      h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(job.job_id)}` }, job.job_id)), h("td", {}, job.tenant),
      h("td", {}, stateBadge(job.state)), h("td", {}, job.attempt), h("td", {}, job.gpus_held), h("td", {}, job.reason || ""))),
    { id: "tm-jobs" });
}

// GPUs held (mine, other tenants') and present over the log's span, with a marker at `at`.
export function utilisationChart(target, picture, at) {
  const points = picture.utilisation;
  if (!points.length) { target.replaceChildren(h("p", { class: "muted" }, "No GPU was ever held.")); return; }
  const xs = [], mine = [], other = [], total = [];
  for (const p of points) {
    xs.push(Date.parse(p.at) / 1000); mine.push(p.mine); other.push(p.mine + p.other); total.push(p.gpus);
  }
  const end = picture.span.end ? Date.parse(picture.span.end) / 1000 : xs[xs.length - 1];
  if (end > xs[xs.length - 1]) { xs.push(end); mine.push(mine.at(-1)); other.push(other.at(-1)); total.push(total.at(-1)); }
  const marker = at ? Date.parse(at) / 1000 : null;
  const width = Math.max(280, target.clientWidth || 600);
  target.replaceChildren();
  new uPlot({
    width, height: 200,
    series: [{}, { label: "GPUs present", stroke: "#8a939c", paths: uPlot.paths.stepped({ align: 1 }) },
      { label: "held (all)", stroke: "#c46a00", fill: "rgba(196,106,0,.12)", paths: uPlot.paths.stepped({ align: 1 }) },
      { label: "held (yours)", stroke: "#1f5fbf", fill: "rgba(31,95,191,.25)", paths: uPlot.paths.stepped({ align: 1 }) }],
    axes: [{}, { label: "GPUs" }],
    scales: { y: { range: (u, min, max) => [0, Math.max(1, max)] } },
    hooks: { draw: [(u) => {
      if (marker === null) return;
      const x = u.valToPos(marker, "x", true);
      const ctx = u.ctx;
      ctx.save(); ctx.strokeStyle = "#b3261e"; ctx.lineWidth = 2; ctx.beginPath();
      ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke(); ctx.restore();
    }] },
  }, [xs, total, other, mine], target);
}
