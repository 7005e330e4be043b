// Talking to the service: JSON requests, the native server-sent event stream, readable errors.
// Every URL is relative to the page, so the page also works behind a proxy that adds a path prefix.

const KEY_STORAGE = "tad-playground-api-key";

// The API key lives in memory, and in sessionStorage (this tab only) if the user asks for it.
// It is only ever sent as a header, never put in a URL. A browser that blocks site data throws on
// any storage access: the key then lives in memory only.
function stored(action) {
  try {
    return action(window.sessionStorage);
  } catch {
    return null;
  }
}

let apiKey = stored((storage) => storage.getItem(KEY_STORAGE));

export function hasApiKey() {
  return Boolean(apiKey);
}

/** What is wrong with `key` as a header value, or null. fetch refuses a header with other characters,
 * which would read as the service being unreachable. */
export function apiKeyProblem(key) {
  return /^[\x21-\x7e]*$/.test(key) ? null : "an API key is printable ASCII without spaces";
}

export function setApiKey(key, remember) {
  apiKey = key || null;
  if (remember && apiKey) stored((storage) => storage.setItem(KEY_STORAGE, apiKey));
  else stored((storage) => storage.removeItem(KEY_STORAGE));
}

/** An error response of the service: {"error": {"message", "type", "param", "code"}}, or no answer at all. */
export class ApiError extends Error {
  constructor(status, message, { param = null, type = null, retryAfter = null } = {}) {
    super(message);
    this.status = status;
    this.param = param;
    this.type = type;
    this.retryAfter = retryAfter;
  }
}

function headers(json) {
  const result = { Accept: json ? "application/json" : "*/*" };
  if (json) result["Content-Type"] = "application/json";
  if (apiKey) result.Authorization = `Bearer ${apiKey}`;
  return result;
}

async function errorOf(response) {
  let detail = {};
  try {
    detail = (await response.json()).error || {};
  } catch {
    // Not JSON (a proxy's page, say): the status line still says something.
  }
  const retry = Number.parseInt(response.headers.get("Retry-After") || "", 10);
  return new ApiError(response.status, detail.message || response.statusText || "request failed", {
    param: detail.param ?? null,
    type: detail.type ?? null,
    retryAfter: Number.isFinite(retry) ? retry : null,
  });
}

async function send(path, { method = "GET", body, signal, json = true } = {}) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: headers(json),
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      cache: "no-store",
    });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, "the service cannot be reached (is it running?)");
  }
  if (!response.ok) throw await errorOf(response);
  return response;
}

export async function getJson(path, options = {}) {
  return (await send(path, options)).json();
}

export async function postJson(path, body, options = {}) {
  return (await send(path, { ...options, method: "POST", body })).json();
}

/** An image of the service as a blob URL (fetched with the key header, which an <img src> cannot send). */
export async function blobUrl(path) {
  const response = await send(path, { json: false });
  return URL.createObjectURL(await response.blob());
}

/** Parse one server-sent event block ("event: x\ndata: {...}") into {event, data}. */
function parseEvent(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  return data.length ? { event, data: JSON.parse(data.join("\n")) } : null;
}

/** POST a streaming request and yield its events ({event: "token" | "final" | "error", data}) as they arrive. */
export async function* streamEvents(path, body, signal) {
  const response = await send(path, { method: "POST", body: { ...body, stream: true }, signal });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value.replace(/\r\n/g, "\n");
      let end = buffer.indexOf("\n\n");
      while (end >= 0) {
        const parsed = parseEvent(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
        if (parsed) yield parsed;
        end = buffer.indexOf("\n\n");
      }
    }
    const last = parseEvent(buffer.trim());
    if (last) yield last;
  } finally {
    // The page stopped reading early (an error while showing a token): closing the stream tells the
    // service, which cancels the generation instead of finishing it for nobody.
    reader.cancel().catch(() => {});
  }
}

const FIELD_NAMES = {
  max_new_tokens: "Max new tokens",
  temperature: "Temperature",
  seed: "Seed",
  top_logprobs: "Top alternatives",
  messages: "Question",
  prompt: "Prompt",
  response: "Answer",
  "policy.target": "Policy target",
  "policy.method": "Policy method",
  "policy.threshold": "Threshold",
};

/** A sentence a person can act on, for any error a request can end with. */
export function describeError(error) {
  if (!(error instanceof ApiError)) return `Something went wrong in the page: ${error.message || error}`;
  const retry = error.retryAfter ? ` Try again in ${error.retryAfter} s.` : "";
  switch (error.status) {
    case 0:
      return `The service cannot be reached: ${error.message}.`;
    case 401:
      return "This service needs an API key: enter it above (it is sent as a header, never in a URL).";
    case 413:
      return "The request is too large for this service.";
    case 422: {
      const field = error.param ? `${FIELD_NAMES[error.param] || error.param} (${error.param}): ` : "";
      return `Invalid input. ${field}${error.message}`;
    }
    case 429:
      return `The service is busy (too many requests in flight).${retry || " Try again shortly."}`;
    case 503:
      return `The service is not ready (the model may still be loading, or it is shutting down): ${error.message}.${retry}`;
    case 504:
      return "The request ran past the service's deadline; try fewer tokens.";
    default:
      return `The service answered ${error.status}: ${error.message}`;
  }
}
