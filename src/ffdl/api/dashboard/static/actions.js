// Halt, resume, cancel: each asks for confirmation and shows the API's refusal verbatim.
import { api } from "./api.js";
import { h } from "./dom.js";

const LIVE = new Set(["SUBMITTED", "QUEUED", "SCHEDULED", "LAUNCHING", "RUNNING", "RESTARTING", "STORING", "HALTING"]);

export function actionsFor(job, alert, after) {
  const act = async (verb, method, path) => {
    if (!window.confirm(`${verb} ${job.job_id}?`)) return;
    alert.textContent = "";
    try {
      await api(path, { method });
      after?.();
    } catch (error) {
      alert.textContent = `${verb} refused: ${error.message}`;
    }
  };
  const id = encodeURIComponent(job.job_id);
  return [
    h("button", { type: "button", disabled: !LIVE.has(job.state) || job.state === "HALTING", "aria-label": `Halt ${job.job_id}`,
      onclick: () => act("Halt", "POST", `/v1/jobs/${id}:halt`) }, "Halt"),
    h("button", { type: "button", disabled: job.state !== "HALTED", "aria-label": `Resume ${job.job_id}`,
      onclick: () => act("Resume", "POST", `/v1/jobs/${id}:resume`) }, "Resume"),
    h("button", { type: "button", class: "danger", disabled: !LIVE.has(job.state) && job.state !== "HALTED", "aria-label": `Cancel ${job.job_id}`,
      onclick: () => act("Cancel", "DELETE", `/v1/jobs/${id}`) }, "Cancel"),
  ];
}
