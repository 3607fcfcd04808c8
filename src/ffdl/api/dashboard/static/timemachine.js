// The time machine: the cluster as it was at any moment of the log, folded from the log by the server.
import { api } from "./api.js";
import { debounce, h, keepingFocus, time } from "./dom.js";
import { gpuMap, jobStates, queueTable, tenantTable, utilisationChart } from "./gpumap.js";

export async function timeMachinePage({ main, hash }) {
  const asked = new URLSearchParams(hash.split("?")[1] || "").get("at");
  const slider = h("input", { type: "range", id: "tm-slider", min: 0, max: 1, step: 1, value: 0, "aria-label": "Moment in the log" });
  const at = h("input", { id: "tm-at", size: 34, "aria-label": "Moment (ISO 8601)" });
  const prev = h("button", { type: "button", id: "tm-prev" }, "◀ Previous event");
  const next = h("button", { type: "button", id: "tm-next" }, "Next event ▶");
  const now = h("button", { type: "button" }, "End of log");
  const where = h("p", { id: "tm-where", "aria-live": "polite" });
  const map = h("div", {}), chart = h("div", { class: "chart", id: "tm-utilisation" }), queues = h("div", {}),
    tenants = h("div", {}), jobs = h("div", {});
  main.append(h("h1", {}, "Time machine"),
    h("section", { class: "card" },
      h("p", { class: "muted" }, "The cluster as it was at any moment, rebuilt from the event log (not sampled)."),
      h("div", { class: "tm-controls" }, prev, slider, next),
      h("form", { class: "tm-controls", onsubmit: (e) => { e.preventDefault(); go(at.value); } },
        h("label", { for: "tm-at" }, "At"), at, h("button", { type: "submit" }, "Go"), now),
      where),
    h("section", { class: "card" }, h("h2", {}, "GPU map"), map),
    h("section", { class: "card" }, h("h2", {}, "Utilisation"), chart),
    h("div", { class: "grid2" }, h("section", { class: "card" }, h("h2", {}, "Queue"), queues),
      h("section", { class: "card" }, h("h2", {}, "Tenants"), tenants)),
    h("section", { class: "card" }, h("h2", {}, "Every job's state"), jobs));

  let picture = null;
  const show = (p) => {
    picture = p;
    const start = Date.parse(p.span.start), end = Date.parse(p.span.end);
    slider.min = String(start || 0);
    slider.max = String(end || 1);
    slider.value = String(p.at ? Date.parse(p.at) : end);
    at.value = p.at || p.span.end || "";
    const after = p.previous_event;
    where.textContent = p.span.start
      ? `${time(p.at || p.span.end)}: after ${p.applied} of ${p.span.events} events` +
        (after ? `; the last was ${after.type} of ${after.key}${after.seq ? ` (seq ${after.seq})` : ""} at ${time(after.at)}` : "")
      : "The log is empty.";
    prev.disabled = !after;
    next.disabled = !p.next_event;
    keepingFocus(main, () => {
      map.replaceChildren(gpuMap(p));
      queues.replaceChildren(queueTable(p));
      tenants.replaceChildren(tenantTable(p));
      jobs.replaceChildren(jobStates(p));
      utilisationChart(chart, p, p.at);
    });
    main.dataset.at = p.at || "";
  };
  const go = async (moment) => {
    const query = moment ? `?at=${encodeURIComponent(moment)}` : "";
    history.replaceState(null, "", `/#/timemachine${query}`);
    show(await api(`/v1/timemachine${query}`));
  };
  slider.addEventListener("input", debounce(() => go(new Date(Number(slider.value)).toISOString()), 150));
  prev.addEventListener("click", () => go(new Date(Date.parse(picture.previous_event.at) - 1).toISOString()));
  next.addEventListener("click", () => go(picture.next_event.at));
  now.addEventListener("click", () => go(null));
  await go(asked);
}
