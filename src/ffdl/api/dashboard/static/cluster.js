// The cluster now: the GPU map, utilisation over time, queues and tenants' shares; refreshed as jobs and nodes change.
import { api, follow } from "./api.js";
import { debounce, h, keepingFocus } from "./dom.js";
import { gpuMap, queueTable, tenantTable, utilisationChart } from "./gpumap.js";

export async function clusterPage({ main, signal }) {
  let byTenant = false;
  const toggle = h("button", { type: "button", "aria-pressed": "false" }, "Colour by tenant");
  const map = h("div", {}), chart = h("div", { class: "chart", id: "utilisation" }), queues = h("div", {}), tenants = h("div", {});
  main.append(h("h1", {}, "Cluster"),
    h("section", { class: "card", "aria-labelledby": "map-title" }, h("div", { class: "row" }, h("h2", { id: "map-title" }, "GPU map"), toggle), map),
    h("section", { class: "card", "aria-labelledby": "util-title" }, h("h2", { id: "util-title" }, "Utilisation over time"), chart),
    h("div", { class: "grid2" },
      h("section", { class: "card", "aria-labelledby": "q-title" }, h("h2", { id: "q-title" }, "Queue"), queues),
      h("section", { class: "card", "aria-labelledby": "t-title" }, h("h2", { id: "t-title" }, "Tenants: quota, borrowing, fair share"), tenants)));
  let picture = null;
  const draw = () => keepingFocus(main, () => {
    map.replaceChildren(gpuMap(picture, { byTenant }));
    queues.replaceChildren(queueTable(picture));
    tenants.replaceChildren(tenantTable(picture));
    utilisationChart(chart, picture, null);
  });
  const refresh = async () => {
    picture = await api("/v1/timemachine");
    if (!signal.aborted) draw();
  };
  toggle.addEventListener("click", () => {
    byTenant = !byTenant;
    toggle.setAttribute("aria-pressed", String(byTenant));
    draw();
  });
  await refresh();
  // one read at a time: a change while one is under way asks for one more after it, not one each
  // (each read folds the whole log on the server, and they queued faster than they were answered)
  let reading = false, again = false;
  const reread = async () => {
    if (reading) { again = true; return; }
    reading = true;
    try {
      do { again = false; await refresh().catch(() => {}); } while (again && !signal.aborted);
    } finally { reading = false; }
  };
  const later = debounce(reread, 500);
  // a job or a node changed (a cordon too): read the picture again, at most twice a second
  follow("/v1/cluster:follow", (message) => { if (message.event === "cluster") later(); }, signal, { reconnect: true }).catch(() => {});
}
