// The job list: filters, pages of 50 (never every job at once), live over /v1/jobs:follow.
import { api, follow } from "./api.js";
import { actionsFor } from "./actions.js";
import { age, counted, h, keepingFocus, stateBadge, table } from "./dom.js";

const PAGE = 50;
const STATES = ["SUBMITTED", "QUEUED", "SCHEDULED", "LAUNCHING", "RUNNING", "RESTARTING", "HALTING", "HALTED",
  "STORING", "COMPLETED", "FAILED", "CANCELLED"];

function filtersFrom(hash) {
  const params = new URLSearchParams(hash.split("?")[1] || "");
  return { state: params.get("state") || "", label: params.get("label") || "", since: params.get("since") || "",
    tenant: params.get("tenant") || "" };
}

function matches(job, f) {
  if (f.state && job.state !== f.state) return false;
  if (f.tenant && job.tenant !== f.tenant) return false;
  // as instants: the API's "…:05.123456+00:00" sorts before the page's "…:05.123Z" as text
  if (f.since && Date.parse(job.submitted_at) < new Date(f.since).getTime()) return false;
  if (f.label) {
    const [key, value] = f.label.split("=");
    if ((job.spec.labels || {})[key] !== value) return false;
  }
  return true;
}

export async function jobsPage({ main, me, signal, hash }) {
  const f = filtersFrom(hash);
  const alert = h("div", { class: "alert", role: "alert", "aria-live": "assertive" });
  const stateSelect = h("select", { id: "f-state", name: "state" }, h("option", { value: "" }, "any"),
    STATES.map((s) => h("option", { value: s, selected: s === f.state }, s)));
  const form = h("form", { class: "row card", role: "search", "aria-label": "Filter jobs" },
    h("label", {}, "State", stateSelect),
    h("label", {}, "Label", h("input", { name: "label", placeholder: "KEY=VALUE", value: f.label, size: 14 })),
    h("label", {}, "Submitted since", h("input", { name: "since", type: "datetime-local", value: f.since })),
    me.admin ? h("label", {}, "Tenant", h("input", { name: "tenant", value: f.tenant, size: 10 })) : null,
    h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const params = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v) params.set(k, v);
    location.hash = `#/jobs?${params}`;
  });
  const body = h("tbody", { id: "jobs-body" });
  const headings = ["Job", "State", me.admin ? "Tenant" : null, "Learners × GPUs", "Age", "Attempt", "Actions"].filter(Boolean);
  const tableEl = table(headings, [], { id: "jobs", "aria-label": "Jobs" });
  const NARROW_HIDDEN = ["Learners × GPUs", "Age"]; // left out on a phone, where the id and actions need the room
  for (const th of tableEl.querySelectorAll("th")) if (NARROW_HIDDEN.includes(th.textContent)) th.classList.add("hide-narrow");
  tableEl.querySelector("table").replaceChild(body, tableEl.querySelector("tbody"));
  const pager = h("div", { class: "pager" });
  const live = h("span", { class: "muted", id: "live", "aria-live": "polite" }, "");
  main.append(h("h1", {}, "Jobs"), form, alert, tableEl, pager, live);

  const rows = new Map();
  let firstPage = true;
  const rowFor = (job) => h("tr", { "data-job": job.job_id, "data-state": job.state },
    h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(job.job_id)}` }, job.job_id)),
    h("td", {}, stateBadge(job.state)),
    me.admin ? h("td", {}, job.tenant) : null,
    h("td", { class: "hide-narrow" }, `${job.spec.learners} × ${job.spec.gpus}`),
    h("td", { class: "hide-narrow", title: job.submitted_at }, age(job.submitted_at)),
    h("td", {}, job.attempt),
    h("td", { class: "actions" }, actionsFor(job, alert)));
  const show = (job) => {
    const row = rowFor(job);
    const old = rows.get(job.job_id);
    if (old) keepingFocus(body, () => old.replaceWith(row));
    else body.prepend(row);
    rows.set(job.job_id, row);
    while (rows.size > PAGE) {
      const last = body.lastElementChild;
      rows.delete(last.dataset.job);
      last.remove();
    }
  };

  const query = new URLSearchParams({ limit: PAGE });
  if (f.state) query.set("state", f.state);
  if (f.label) query.set("label", f.label);
  if (f.since) query.set("submitted_since", new Date(f.since).toISOString());
  if (f.tenant) query.set("tenant", f.tenant);
  const load = async (cursor) => {
    const q = new URLSearchParams(query);
    if (cursor) q.set("cursor", cursor);
    const page = await api(`/v1/jobs?${q}`);
    firstPage = !cursor;
    rows.clear();
    body.replaceChildren(...page.jobs.map((job) => {
      const row = rowFor(job);
      rows.set(job.job_id, row);
      return row;
    }));
    if (!page.jobs.length) body.append(h("tr", {}, h("td", { colspan: headings.length, class: "muted" }, "No jobs.")));
    pager.replaceChildren(
      h("button", { type: "button", disabled: firstPage, onclick: () => load(null) }, "First page"),
      h("button", { type: "button", disabled: !page.next_cursor, onclick: () => load(page.next_cursor) }, "Next page"));
  };
  await load(null);

  let received = 0;
  follow("/v1/jobs:follow", (message) => {
    if (message.event !== "jobs") {
      live.textContent = "Live";
      return;
    }
    const { jobs, gone } = JSON.parse(message.data);
    received += jobs.length;
    for (const job of jobs) {
      if (rows.has(job.job_id)) {
        if (matches(job, f)) show(job);
        else { rows.get(job.job_id).remove(); rows.delete(job.job_id); }
      } else if (firstPage && matches(job, f)) {
        body.querySelector("td[colspan]")?.parentElement.remove();
        show(job);
      }
    }
    for (const id of gone) { rows.get(id)?.remove(); rows.delete(id); }
    live.textContent = `Live: ${counted(received, "update")}`;
    live.dataset.updates = String(received);
  }, signal, { reconnect: true }).catch((error) => { alert.textContent = error.message; });
}
