// The dashboard: sign-in, then hash routes #/jobs, #/jobs/ID, #/cluster, #/timemachine?at=TIME.
import { api, ApiError, setToken } from "./api.js";
import { h } from "./dom.js";
import { jobsPage } from "./jobs.js";
import { jobPage } from "./job.js";
import { clusterPage } from "./cluster.js";
import { timeMachinePage } from "./timemachine.js";

const main = document.getElementById("main");
let me = null;
let current = null;

const routes = [
  [/^#\/jobs\/([^?]+)/, (m, ctx) => jobPage(decodeURIComponent(m[1]), ctx)],
  [/^#\/cluster/, (m, ctx) => clusterPage(ctx)],
  [/^#\/timemachine/, (m, ctx) => timeMachinePage(ctx)],
  [/^/, (m, ctx) => jobsPage(ctx)],
];

async function whoami() {
  const answer = await api("/v1/whoami");
  return answer.tenant === null ? null : answer;
}

function signIn(message) {
  const input = h("input", { id: "token", type: "password", autocomplete: "off", required: true, "aria-describedby": "token-help" });
  const status = h("div", { class: "alert", role: "alert" }, message || "");
  const form = h("form", { class: "card signin", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in"),
    h("label", { for: "token" }, "Tenant token", input),
    h("p", { id: "token-help", class: "muted" }, "Kept in this tab only (session storage), sent as a bearer token."),
    status,
    h("button", { class: "primary", type: "submit" }, "Sign in"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    setToken(input.value.trim());
    me = await whoami();
    if (me === null) {
      setToken(null);
      status.textContent = "That token is not valid.";
      input.focus();
      return;
    }
    render();
  });
  main.replaceChildren(form);
  input.focus();
}

function chrome() {
  document.getElementById("nav").hidden = false;
  document.getElementById("who").textContent = me.open ? "" : `${me.tenant}${me.admin ? " (admin)" : ""}`;
  const signOut = document.getElementById("signout");
  signOut.hidden = me.open;
  const banner = document.getElementById("banner");
  banner.hidden = !me.open;
  banner.textContent = me.open
    ? "Open mode: this platform has no tenants, so anyone who reaches it sees and changes every job."
    : "";
  for (const link of document.querySelectorAll("#nav a")) {
    const here = location.hash.startsWith(link.getAttribute("href")) || (!location.hash && link.hash === "#/jobs");
    if (here) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

async function render() {
  current?.abort();
  current = new AbortController();
  if (me === null) me = await whoami();
  if (me === null) {
    document.getElementById("nav").hidden = true;
    signIn();
    return;
  }
  chrome();
  const hash = location.hash || "#/jobs";
  const [, page] = routes.find(([pattern]) => pattern.test(hash));
  const ctx = { main, me, signal: current.signal, hash };
  main.replaceChildren();
  try {
    await page(hash.match(routes.find(([p]) => p.test(hash))[0]), ctx);
  } catch (error) {
    if (current.signal.aborted) return;
    if (error instanceof ApiError && error.status === 401) {
      setToken(null);
      me = null;
      signIn("Your token is no longer valid: sign in again.");
      return;
    }
    main.replaceChildren(h("div", { class: "alert", role: "alert" }, `${error.status ? error.status + ": " : ""}${error.message}`));
  }
}

document.getElementById("signout").addEventListener("click", () => {
  setToken(null);
  me = null;
  document.getElementById("who").textContent = "";
  render();
});
window.addEventListener("hashchange", render);
// /?at=TIME opens the time machine at TIME
const at = new URLSearchParams(location.search).get("at");
if (at && !location.hash.startsWith("#/timemachine")) {
  history.replaceState(null, "", `/#/timemachine?at=${encodeURIComponent(at)}`);
}
render();
