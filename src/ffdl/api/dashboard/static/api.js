// The API as the page calls it: the tenant's bearer token lives in this tab's session storage only.
const KEY = "ffdl.token";

export const token = () => sessionStorage.getItem(KEY);
export const setToken = (value) => (value ? sessionStorage.setItem(KEY, value) : sessionStorage.removeItem(KEY));

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers(extra = {}) {
  const t = token();
  return t ? { ...extra, Authorization: `Bearer ${t}` } : extra;
}

async function problem(response) {
  try {
    const body = await response.json();
    const detail = Array.isArray(body.detail) ? body.detail.map((d) => d.message).join("; ") : body.detail;
    return new ApiError(response.status, detail || response.statusText);
  } catch {
    return new ApiError(response.status, response.statusText);
  }
}

// A JSON (or text) answer; a refusal throws ApiError with the API's message verbatim.
export async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: headers(options.headers) });
  if (!response.ok) throw await problem(response);
  const type = response.headers.get("content-type") || "";
  return type.includes("json") ? response.json() : response.text();
}

// Server-Sent Events over fetch (EventSource cannot send a bearer token): calls onEvent({event, data, id})
// until the stream ends or `signal` aborts; resumes with Last-Event-ID after a dropped connection.
export async function follow(path, onEvent, signal, { reconnect = false } = {}) {
  let lastId = null;
  while (!signal.aborted) {
    try {
      const extra = { Accept: "text/event-stream" };
      if (lastId !== null) extra["Last-Event-ID"] = lastId;
      const response = await fetch(path, { headers: headers(extra), signal });
      if (!response.ok) throw await problem(response);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const message = { event: "message", data: "", id: null };
          for (const line of block.split("\n")) {
            if (!line || line.startsWith(":")) continue;
            const colon = line.indexOf(":");
            const field = colon < 0 ? line : line.slice(0, colon);
            const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
            if (field === "data") message.data += (message.data ? "\n" : "") + text;
            else if (field === "event") message.event = text;
            else if (field === "id") message.id = text;
          }
          if (message.id !== null) lastId = message.id;
          if (message.data) onEvent(message);
        }
      }
      if (!reconnect) return;
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof ApiError && error.status < 500) throw error;
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

// A streamed text body (a following log), chunk by chunk, until it ends or `signal` aborts.
export async function stream(path, onText, signal) {
  const response = await fetch(path, { headers: headers(), signal });
  if (!response.ok) throw await problem(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    onText(value);
  }
}
