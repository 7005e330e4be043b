// The sequence verdict (accepted / rejected, score, threshold, policy) and what a policy guarantees, in words.

import { formatNumber, formatPercent } from "./scale.js";

/** The artifact's calibrated entry for a policy name like "calibrated:error@0.7", or null. */
export function calibratedEntry(info, method, policyName) {
  if (!policyName || !policyName.startsWith("calibrated:")) return null;
  const target = policyName.slice("calibrated:".length);
  return info.artifact?.thresholds?.[method]?.[target] ?? null;
}

function confidenceOf(guarantee) {
  // The manifest states it as "P(error rate among accepted <= a) >= 1 - delta ...".
  const match = /\)\s*>=\s*([0-9.]+)/.exec(guarantee || "");
  return match ? formatPercent(Number(match[1]), 0) : null;
}

/** What a threshold entry of the artifact promises, in words. */
export function entryWords(entry) {
  const observed = `on the calibration data (n = ${entry.n}) it accepts ${formatPercent(entry.coverage)} of answers, ${formatPercent(entry.error)} of them wrong`;
  if (entry.kind === "error") {
    const confidence = confidenceOf(entry.guarantee);
    const level = confidence ? `, with ${confidence} confidence` : "";
    return `calibrated: at most ${formatPercent(entry.target, 0)} errors among accepted answers${level}; ${observed}`;
  }
  return `calibrated to accept ${formatPercent(entry.target, 0)} of answers, no guarantee on their error rate; ${observed}`;
}

/** What the policy of a decision ({method, threshold, policy}) means, in words. */
export function policyWords(info, decision) {
  const { method, threshold, policy } = decision;
  const entry = calibratedEntry(info, method, policy);
  if (entry) return entryWords(entry);
  switch (policy) {
    case "fixed":
      return `a fixed threshold (${formatNumber(threshold)}) on ${method}: no calibrated guarantee`;
    case "fallback:fixed":
      return `TAD is unavailable: a fixed threshold (${formatNumber(threshold)}) on ${method}, no calibrated guarantee`;
    case "fallback:none":
      return "TAD is unavailable and no fallback threshold is set: every answer is accepted";
    case "none":
      return "no threshold is set: every answer is accepted";
    default:
      return policy && policy.startsWith("calibrated:")
        ? `${policy}: the loaded artifact does not describe this target`
        : `policy ${policy}`;
  }
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** The badge: icon and word (never colour alone), score against threshold, policy and its meaning. */
export function renderVerdict(container, info, response) {
  const { decision } = response;
  container.className = `verdict ${decision.accept ? "accepted" : "rejected"}`;
  const title = element("p", "verdict-title");
  title.append(
    element("span", "verdict-icon", decision.accept ? "✓" : "✕"),
    element("span", "verdict-word", decision.accept ? "Accepted" : "Rejected"),
  );
  let comparison;
  if (decision.score === null) {
    comparison = `no ${decision.method} score (empty answer): rejected`;
  } else if (decision.threshold === null) {
    comparison = `${decision.method} uncertainty ${formatNumber(decision.score)}; no threshold`;
  } else {
    const sign = decision.score <= decision.threshold ? "≤" : ">";
    comparison = `${decision.method} uncertainty ${formatNumber(decision.score)} ${sign} threshold ${formatNumber(decision.threshold)}`;
  }
  const detail = element("p", "verdict-score", comparison);
  const policy = element("p", "verdict-policy");
  policy.append(element("code", null, decision.policy), ` — ${policyWords(info, decision)}`);
  const parts = [title, detail, policy];
  if (decision.withheld) {
    parts.push(element("p", "verdict-policy", "Withheld: the service sent its message instead of the answer."));
  } else if (!decision.accept && info.policy?.action === "withhold") {
    // The page asks for every answer (action "flag") so that it can show the tokens.
    parts.push(element("p", "verdict-policy", "API clients of this service get its withheld message instead of this answer."));
  }
  container.replaceChildren(...parts);
}

export function renderPending(container, text) {
  container.className = "verdict pending";
  container.replaceChildren(element("p", "verdict-title", text));
}

/**
 * The running sequence uncertainty of the tokens so far, as the service computes it at the end
 * (so an early stop can be watched coming). Null where the page cannot follow the method.
 */
export function runningScore(method, tokens, aggregation) {
  if (tokens.length === 0) return null;
  const sum = (values) => values.reduce((a, b) => a + b, 0);
  const logprobs = tokens.map((t) => t.logprob);
  switch (method) {
    case "tad": {
      const confidences = tokens.map((t) => t.confidence);
      if (confidences.some((c) => c === null)) return null;
      switch (aggregation) {
        case "mean":
          return 1 - sum(confidences) / confidences.length;
        case "sum-log":
          return -sum(confidences.map(Math.log));
        case "mean-log":
          return -sum(confidences.map(Math.log)) / confidences.length;
        case "min":
          return 1 - Math.min(...confidences);
        default:
          return null; // an aggregation this page does not know: no running score rather than a wrong one
      }
    }
    case "msp":
      return -sum(logprobs);
    case "perplexity":
      return -sum(logprobs) / logprobs.length;
    case "mean_token_entropy":
      return sum(tokens.map((t) => t.entropy)) / tokens.length;
    case "max_token_uncertainty":
      return Math.max(...logprobs.map((lp) => -lp));
    default:
      return null; // e.g. RAUQ needs attention the page does not have
  }
}
