// Small DOM helpers: elements are built, never parsed from strings, so no data is ever markup.
export function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
    else if (key === "class") element.className = value;
    else if (key === "style" && typeof value === "object") Object.assign(element.style, value);
    else element.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
  return element;
}

// "1 update", "3 updates": a count in words, not "update(s)".
export const counted = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

export const stateBadge = (state) => h("span", { class: `state s-${state}` }, state);

export function age(iso, now = Date.now()) {
  const s = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d`;
}

export const time = (iso) => (iso ? new Date(iso).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "");

// A colour per job (or tenant) that stays the same across pages and reloads.
export function colour(name) {
  let hash = 0;
  for (const c of name) hash = (hash * 31 + c.charCodeAt(0)) >>> 0;
  return `hsl(${hash % 360} 60% 42%)`;
}

export const STATE_COLOURS = {
  SUBMITTED: "#6b7785", QUEUED: "#6b7785", SCHEDULED: "#5f6fbf", LAUNCHING: "#5f6fbf", RUNNING: "#1f5fbf",
  RESTARTING: "#c46a00", HALTING: "#7a4fb0", HALTED: "#7a4fb0", STORING: "#238a8a", COMPLETED: "#1e7f3c",
  FAILED: "#b3261e", CANCELLED: "#5a5a5a",
};

export function table(headings, rows, attrs = {}) {
  return h("div", { class: "scroll" },
    h("table", attrs,
      h("thead", {}, h("tr", {}, headings.map((x) => h("th", { scope: "col" }, x)))),
      h("tbody", {}, rows)));
}

export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

const FOCUSABLE = "a[href], button, input, select, textarea, [tabindex]";

// Live updates rebuild parts of a page; a keyboard user must not be thrown back to the top by one.
// ``update`` may replace anything inside ``scope``; whatever had the focus there gets it back in its
// new form: the element with the same id, link, label or name, else the one at the same place.
export function keepingFocus(scope, update) {
  const focused = document.activeElement;
  if (!focused || focused === document.body || !scope.contains(focused)) { update(); return; }
  const attr = ["id", "href", "aria-label", "name"].find((a) => focused.hasAttribute(a));
  const key = attr ? `${focused.tagName}[${attr}="${CSS.escape(focused.getAttribute(attr))}"]` : null;
  const place = [...scope.querySelectorAll(FOCUSABLE)].indexOf(focused);
  update();
  if (scope.contains(document.activeElement)) return;
  const again = (key && scope.querySelector(key)) || scope.querySelectorAll(FOCUSABLE)[place];
  again?.focus({ preventScroll: true });
}
