// The playground: ask a question (streamed, token by token) or score a given answer, and see each
// token's uncertainty, the verdict, and the artifact's calibration. Talks only to this service.

import { ApiError, apiKeyProblem, describeError, getJson, hasApiKey, postJson, setApiKey, streamEvents } from "./api.js";
import { renderCalibration, renderReport } from "./calibration.js";
import { MEASURES, formatNumber, gradientStops } from "./scale.js";
import { setUpTabs } from "./tabs.js";
import { TokenView } from "./tokens.js";
import { policyWords, renderPending, renderVerdict, runningScore } from "./verdict.js";

// Tells fallback.js that the module started (it warns when a browser could not run it).
document.documentElement.dataset.started = "true";

const $ = (id) => document.getElementById(id);
const view = new TokenView($("tokens"), $("token-tip"));
let info = null; // GET /info
let running = null; // the AbortController of the generation in flight
let mode = "ask";

// ------------------------------------------------------------------ messages
function showMessage(text, kind = "error") {
  const box = $("message");
  box.textContent = text;
  box.className = `message ${kind}`;
  box.hidden = false;
}

function clearMessage() {
  $("message").hidden = true;
  for (const input of document.querySelectorAll("[aria-invalid='true']")) input.removeAttribute("aria-invalid");
}

const FIELD_INPUTS = {
  max_new_tokens: "max-new-tokens",
  temperature: "temperature",
  seed: "seed",
  top_logprobs: "top-logprobs",
  response: "score-answer",
  "policy.method": "policy-method",
  "policy.target": "policy-target",
  "policy.threshold": "policy-threshold",
};

function inputFor(param) {
  const root = (param || "").split(".")[0];
  if (root === "prompt" || root === "messages") return $(mode === "ask" ? "question" : "score-prompt");
  return $(FIELD_INPUTS[param] || FIELD_INPUTS[root] || "");
}

function showError(error) {
  showMessage(describeError(error));
  if (!(error instanceof ApiError)) return;
  if (error.status === 401) openKeyForm();
  const input = error.status === 422 ? inputFor(error.param) : null;
  if (input) input.setAttribute("aria-invalid", "true");
}

window.addEventListener("error", (event) => showMessage(`The page hit an error: ${event.message}`));
window.addEventListener("unhandledrejection", (event) => showError(event.reason));

// ------------------------------------------------------------------ API key
function openKeyForm() {
  $("key-form").hidden = false;
  $("key-button").setAttribute("aria-expanded", "true");
  $("api-key").focus();
}

$("key-button").addEventListener("click", () => {
  if ($("key-form").hidden) openKeyForm();
  else {
    $("key-form").hidden = true;
    $("key-button").setAttribute("aria-expanded", "false");
  }
});

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const key = $("api-key").value.trim();
  const problem = apiKeyProblem(key);
  if (problem) {
    showMessage(`That key cannot be sent: ${problem}.`);
    $("api-key").focus();
    return;
  }
  setApiKey(key, $("remember-key").checked);
  $("api-key").value = "";
  $("key-form").hidden = true;
  $("key-button").setAttribute("aria-expanded", "false");
  $("key-button").textContent = hasApiKey() ? "API key ✓" : "API key";
  boot();
});

// ------------------------------------------------------------------ start-up
let bootRetry = null; // the pending retry while the service loads: one boot loop at a time

async function boot() {
  clearTimeout(bootRetry);
  bootRetry = null;
  try {
    info = await getJson("info");
  } catch (error) {
    if (error instanceof ApiError && (error.status === 503 || error.status === 0)) {
      // Loading (or briefly unreachable): say so and keep trying, as the service's Retry-After asks.
      const seconds = error.retryAfter ?? 3;
      const why = error.status === 503 ? `not ready yet (${error.message})` : "unreachable";
      showMessage(`The service is ${why}. Retrying in ${seconds} s…`, "info");
      bootRetry = setTimeout(boot, seconds * 1000);
    } else {
      showError(error);
    }
    return;
  }
  clearMessage();
  setUp();
}

function setUp() {
  const artifact = info.artifact;
  const features = artifact?.features;
  $("model-line").textContent = info.tad_available
    ? `${info.model.name} · artifact ${artifact.name} (${artifact.aggregation} aggregation, N = ${features.n_lags} lags, ` +
      `${features.convention ?? "consuming"} convention) · ${info.device}`
    : artifact
      ? `${info.model.name} · artifact ${artifact.name}, TAD off (${info.tad_unavailable_reason}) · ${info.device}`
      : `${info.model.name} · no TAD artifact (${info.tad_unavailable_reason}) · ${info.device}`;
  const chat = info.chat_template;
  $("raw-box").hidden = !chat;
  $("system-box").hidden = !chat;
  updatePromptLabels();
  const limits = info.limits;
  $("max-new-tokens").placeholder = String(limits.default_max_new_tokens);
  $("limits-hint").textContent =
    `Max new tokens: 1–${limits.max_new_tokens} (default ${limits.default_max_new_tokens}); ` +
    `top alternatives: 0–${limits.max_top_logprobs ?? 20}.`;
  const topLogprobs = $("top-logprobs");
  topLogprobs.value = String(Math.min(Number(topLogprobs.value), limits.max_top_logprobs ?? 20));
  const tadRadio = document.querySelector("input[name='measure'][value='tad']");
  tadRadio.disabled = !info.tad_available;
  if (!info.tad_available) {
    document.querySelector("input[name='measure'][value='probability']").checked = true;
    view.setMeasure("probability");
  }
  fillMethods();
  fillTargets();
  updatePolicy();
  // A binding policy (TAD_POLICY_OVERRIDES=false) refuses any override: the form shows it, fixed.
  $("policy-box").disabled = !policyOverridable();
  if (!policyOverridable()) $("policy-words").textContent += " (binding: this service accepts no override)";
  renderLegend();
  renderReport($("report"));
}

function updatePromptLabels() {
  const chat = info.chat_template && !$("raw-prompt").checked;
  const label = chat ? "Question (sent as a chat message)" : "Prompt (raw text, no chat template)";
  $("question-label").textContent = label;
  $("score-prompt-label").textContent = label;
  $("question-hint").textContent = chat
    ? "The model's chat template is applied."
    : info.chat_template
      ? "Sent exactly as typed."
      : "This model has no chat template: the text is sent exactly as typed.";
}

$("raw-prompt").addEventListener("change", updatePromptLabels);

// ------------------------------------------------------------------ policy
function option(value, text) {
  const node = document.createElement("option");
  node.value = value;
  node.textContent = text;
  return node;
}

function thresholdsOf(method) {
  return info.artifact?.thresholds?.[method] ?? {};
}

function fillMethods() {
  const methods = new Set([info.policy.method, ...Object.keys(info.artifact?.thresholds ?? {})]);
  const select = $("policy-method");
  select.replaceChildren(
    option("", `default (${info.policy.method})`),
    ...[...methods].map((method) => option(method, method)),
  );
}

function effectiveMethod() {
  return $("policy-method").value || info.policy.method;
}

function fillTargets() {
  const select = $("policy-target");
  const previous = select.value;
  const method = effectiveMethod();
  const entries = thresholdsOf(method);
  const fallback = defaultPolicy(method);
  const options = [option("", `default (${fallback.policy.replace("calibrated:", "")})`)];
  for (const [name, entry] of Object.entries(entries)) {
    options.push(option(name, `${name} (threshold ${formatNumber(entry.threshold)})`));
  }
  options.push(option("fixed", "fixed threshold…"));
  select.replaceChildren(...options);
  select.value = [...select.options].some((o) => o.value === previous) ? previous : "";
}

/** The policy the service applies when a request names only `method` (see app/serving/policy.py). */
function defaultPolicy(method) {
  if (method === info.policy.method) return info.policy;
  const target = info.policy.reject_target; // TAD_REJECT_TARGET, as the service reads it for any method
  const entry = target ? thresholdsOf(method)[target] : null;
  return entry
    ? { method, threshold: entry.threshold, policy: `calibrated:${target}` }
    : { method, threshold: null, policy: "none" };
}

/** What the request's policy will be: for the live running score and the words under the form. */
function previewPolicy() {
  const method = effectiveMethod();
  const target = $("policy-target").value;
  if (target === "fixed") {
    const value = $("policy-threshold").valueAsNumber;
    return { method, threshold: Number.isFinite(value) ? value : null, policy: "fixed" };
  }
  if (target) return { method, threshold: thresholdsOf(method)[target].threshold, policy: `calibrated:${target}` };
  return defaultPolicy(method);
}

function policyOverridable() {
  return info.policy.overridable !== false;
}

/** The request's policy override, or undefined for the service's own (always, where it is binding). */
function policyBody() {
  if (!policyOverridable()) return undefined;
  const policy = {};
  if ($("policy-method").value) policy.method = $("policy-method").value;
  const target = $("policy-target").value;
  if (target === "fixed") {
    const value = $("policy-threshold").valueAsNumber;
    if (!Number.isFinite(value)) {
      throw new ApiError(422, "enter a number for the fixed threshold", { param: "policy.threshold" });
    }
    policy.threshold = value;
  } else if (target) {
    policy.target = target;
  }
  return Object.keys(policy).length ? policy : undefined;
}

function updatePolicy() {
  const fixed = $("policy-target").value === "fixed";
  $("policy-threshold").hidden = !fixed;
  $("policy-threshold-label").hidden = !fixed;
  const preview = previewPolicy();
  $("policy-words").textContent = policyWords(info, preview);
  const active = preview.policy.startsWith("calibrated:") ? preview.policy.slice("calibrated:".length) : null;
  renderCalibration($("calibration"), info, preview.method, active);
}

$("policy-method").addEventListener("change", () => {
  fillTargets();
  updatePolicy();
});
$("policy-target").addEventListener("change", updatePolicy);
$("policy-threshold").addEventListener("input", updatePolicy);

// ------------------------------------------------------------------ tokens, legend, scores
function renderLegend() {
  const measure = MEASURES[view.measure];
  const bar = document.createElement("div");
  bar.className = "legend-bar";
  bar.style.background = `linear-gradient(to right, ${gradientStops()})`;
  const ends = document.createElement("div");
  ends.className = "legend-ends";
  const [low, high] = measure.legend;
  const left = document.createElement("span");
  left.textContent = `◀ ${low}`;
  const right = document.createElement("span");
  right.textContent = `${high} ▶`;
  ends.append(left, right);
  const cues = document.createElement("p");
  cues.className = "hint";
  cues.textContent =
    `Shaded by ${measure.label}: orange = unsure, blue = confident. ` +
    "Underlined too: dotted = lower half, wavy = bottom quarter. Focus or hover a token for its numbers.";
  $("legend").replaceChildren(bar, ends, cues);
}

for (const radio of document.querySelectorAll("input[name='measure']")) {
  radio.addEventListener("change", () => {
    view.setMeasure(radio.value);
    renderLegend();
  });
}

function renderScores(response) {
  const table = $("scores");
  const rows = Object.entries(response.uncertainty).map(([method, value]) => {
    const row = document.createElement("tr");
    const name = document.createElement("th");
    name.scope = "row";
    name.textContent = method === response.decision.method ? `${method} ◀ decides` : method;
    const cell = document.createElement("td");
    cell.textContent = formatNumber(value);
    row.append(name, cell);
    return row;
  });
  table.replaceChildren(...rows);
  $("scores-box").hidden = false;
}

function showLive(expected, tokens, final = false) {
  const score = runningScore(expected.method, tokens, info.artifact?.aggregation);
  if (score === null) {
    $("live").textContent = "";
    return;
  }
  const above = expected.threshold !== null && score > expected.threshold;
  const against = expected.threshold === null ? "" : ` (threshold ${formatNumber(expected.threshold)}${above ? ": above" : ""})`;
  const when = final ? "final" : "running";
  $("live").textContent = `${when} ${expected.method} uncertainty after ${tokens.length} tokens: ${formatNumber(score)}${against}`;
}

function showFinish(response, scored) {
  const notice = $("finish");
  // The answer's tokens as shown: usage also counts the end token and a stop string's tokens.
  const count = response.tokens?.length ?? response.usage.completion_tokens;
  notice.classList.remove("early");
  if (scored) {
    notice.textContent = `Scored ${count} tokens of the given answer (teacher-forced).`;
  } else if (response.finish_reason === "uncertainty") {
    const { method, score, threshold } = response.decision;
    notice.textContent =
      `■ Stopped early after ${count} tokens: the running ${method} uncertainty (${formatNumber(score)}) ` +
      `crossed the threshold ${formatNumber(threshold)}, so the answer is rejected.`;
    notice.classList.add("early");
  } else if (response.finish_reason === "length") {
    notice.textContent = `Stopped at the token limit (${count} tokens).`;
  } else {
    notice.textContent = `Finished (${count} tokens).`;
  }
  if (!scored && response.seed !== null) notice.textContent += ` Seed ${response.seed}.`;
  notice.hidden = false;
}

function showAnswer(response, scored) {
  if (response.decision.withheld) $("tokens").textContent = response.text; // the service's message, no tokens
  else if (scored) view.show(response.tokens ?? []);
  else view.finish(response.tokens);
  renderVerdict($("verdict"), info, response);
  showFinish(response, scored);
  showLive(response.decision, view.tokens, true);
  renderScores(response);
}

function startAnswer(text) {
  view.reset();
  $("finish").hidden = true;
  $("live").textContent = "";
  $("scores-box").hidden = true;
  renderPending($("verdict"), text);
}

// ------------------------------------------------------------------ requests
function promptBody(text) {
  const chat = info.chat_template && !$("raw-prompt").checked;
  if (!chat) return { prompt: text };
  const messages = [];
  if ($("system").value.trim()) messages.push({ role: "system", content: $("system").value });
  messages.push({ role: "user", content: text });
  return { messages };
}

/** A number field's value, or undefined when empty (the service's default applies). */
function numberField(id) {
  const input = $(id);
  return input.value === "" ? undefined : input.valueAsNumber;
}

let startedFrom = null; // the button a keyboard user started the request with

function setRunning(controller) {
  running = controller;
  // A button disabled while it has focus drops the keyboard user's focus to the page: move it to Stop
  // (where it is shown), and back to the starting button at the end.
  const focused = document.activeElement;
  const stops = [$("stop"), $("stop-score")];
  $("generate").disabled = Boolean(controller);
  $("score").disabled = Boolean(controller);
  for (const stop of stops) stop.disabled = !controller;
  if (controller) {
    startedFrom = focused === $("generate") || focused === $("score") ? focused : null;
    const shown = stops.find((stop) => stop.offsetParent !== null);
    if (startedFrom && shown) shown.focus();
  } else if (startedFrom) {
    if (stops.includes(focused) || focused === startedFrom || focused === document.body) startedFrom.focus();
    startedFrom = null;
  }
}

/** The form's request body, or null (the reason shown) when the page is busy or a field is invalid. */
function requestBody(event, build) {
  event.preventDefault();
  if (running || !info) return null;
  clearMessage();
  try {
    return build();
  } catch (error) {
    showError(error);
    return null;
  }
}

async function generate(event) {
  const body = requestBody(event, () => ({
    ...promptBody($("question").value),
    max_new_tokens: numberField("max-new-tokens"),
    temperature: numberField("temperature"),
    seed: numberField("seed"),
    top_logprobs: numberField("top-logprobs"),
    return_attention: true,
    early_stop: $("early-stop").checked,
    // The answer itself even where the service withholds rejected ones (the page is for inspecting them),
    // unless the service's policy is binding.
    policy: policyOverridable() ? { ...policyBody(), action: "flag" } : undefined,
  }));
  if (!body) return;
  const expected = previewPolicy();
  startAnswer("Generating…");
  setRunning(new AbortController());
  try {
    let final = null;
    for await (const { event: name, data } of streamEvents("v1/generate", body, running.signal)) {
      if (name === "token") {
        view.add(data);
        showLive(expected, view.tokens);
      } else if (name === "final") {
        final = data;
      } else if (name === "error") {
        const detail = data.error || {};
        throw new ApiError(detail.code || 500, detail.message || "the generation failed", { param: detail.param });
      }
    }
    if (!final) throw new ApiError(502, "the answer's stream ended before its result (the connection or the service broke off)");
    showAnswer(final, false);
  } catch (error) {
    showFailure(error, "Stopped: a cut-off answer gets no verdict", "Generation stopped.");
  } finally {
    setRunning(null);
  }
}

/** A request that ended without an answer: stopped by the user (Stop), or failed. */
function showFailure(error, stoppedVerdict, stoppedMessage) {
  if (error.name === "AbortError") {
    renderPending($("verdict"), stoppedVerdict);
    showMessage(stoppedMessage, "info");
  } else {
    renderPending($("verdict"), "No verdict");
    showError(error);
  }
}

async function score(event) {
  const body = requestBody(event, () => ({
    ...promptBody($("score-prompt").value),
    response: $("score-answer").value,
    return_attention: true,
    policy: policyBody(),
  }));
  if (!body) return;
  startAnswer("Scoring…");
  setRunning(new AbortController());
  try {
    showAnswer(await postJson("v1/score", body, { signal: running.signal }), true);
  } catch (error) {
    showFailure(error, "Stopped: no verdict", "Scoring stopped.");
  } finally {
    setRunning(null);
  }
}

$("panel-ask").addEventListener("submit", generate);
$("panel-score").addEventListener("submit", score);
for (const stop of [$("stop"), $("stop-score")]) stop.addEventListener("click", () => running?.abort());

setUpTabs(
  [
    ["ask", $("tab-ask"), $("panel-ask")],
    ["score", $("tab-score"), $("panel-score")],
  ],
  (name) => {
    mode = name;
  },
);

$("key-button").textContent = hasApiKey() ? "API key ✓" : "API key";
boot();
