// The answer as shaded tokens, and the tooltip that explains one token.
//
// Tokens are focusable (Tab, or the arrow keys once one has focus); the tooltip opens on focus,
// hover or tap and closes on Escape. Token text is only ever set as text, never as HTML.

import { MEASURES, band, formatNumber, formatPercent, position, shade } from "./scale.js";

const TIP_ID = "token-tip";

function visible(text) {
  if (text === "") return "∅"; // a token that adds no text on its own (e.g. half of a character)
  return text.replace(/\t/g, "⇥").replace(/\n/g, "↵\n");
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function quoted(text) {
  return `“${text.replace(/\n/g, "↵").replace(/\t/g, "⇥")}”`;
}

export class TokenView {
  constructor(container, tip) {
    this.container = container;
    this.tip = tip;
    this.tokens = [];
    this.spans = [];
    this.measure = "tad";
    this.container.addEventListener("keydown", (event) => this.onKey(event));
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape") this.hideTip();
    });
    window.addEventListener("resize", () => this.hideTip());
  }

  reset() {
    this.hideTip();
    this.tokens = [];
    this.spans = [];
    this.container.replaceChildren();
  }

  /** Append one token (a streamed `token` event or an entry of a response's `tokens`). */
  add(token) {
    const span = element("span", "tok", visible(token.text));
    // One tab stop for the whole answer (a roving tabindex): Tab moves past it, the arrows walk it.
    span.tabIndex = this.spans.length === 0 ? 0 : -1;
    span.dataset.index = String(this.tokens.length);
    span.setAttribute("aria-describedby", TIP_ID);
    span.addEventListener("focus", () => {
      for (const other of this.spans) other.tabIndex = other === span ? 0 : -1;
      this.showTip(span);
    });
    span.addEventListener("blur", () => this.hideTip());
    span.addEventListener("mouseenter", () => this.showTip(span));
    span.addEventListener("mouseleave", () => {
      if (document.activeElement !== span) this.hideTip();
    });
    this.tokens.push(token);
    this.spans.push(span);
    this.paint(span, token);
    this.container.append(span);
  }

  /** All tokens at once (a scored answer, or a non-streamed one). */
  show(tokens) {
    this.reset();
    for (const token of tokens) this.add(token);
  }

  /**
   * The final response's tokens: the streamed ones already carry the same numbers (tested server-side),
   * so only a mismatch (e.g. tokens the stream never showed) redraws the answer.
   */
  finish(tokens) {
    if (!tokens || tokens.length === this.tokens.length) return;
    this.show(tokens);
  }

  setMeasure(measure) {
    this.measure = measure;
    this.spans.forEach((span, i) => this.paint(span, this.tokens[i]));
    if (this.current) this.showTip(this.current);
  }

  paint(span, token) {
    const t = position(token, this.measure);
    span.style.backgroundColor = shade(t);
    span.dataset.position = t === null ? "" : t.toFixed(4); // 0 unsure .. 1 confident (tests and scripts read it)
    span.classList.remove("band-none", "band-low", "band-mid", "band-high");
    span.classList.add(band(t));
  }

  onKey(event) {
    const span = event.target.closest(".tok");
    if (!span) return;
    const index = Number(span.dataset.index);
    const step = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 }[event.key];
    if (step) {
      event.preventDefault();
      this.spans[Math.min(Math.max(index + step, 0), this.spans.length - 1)].focus();
    } else if (event.key === "Home" || event.key === "End") {
      event.preventDefault();
      this.spans[event.key === "Home" ? 0 : this.spans.length - 1].focus();
    }
  }

  hideTip() {
    this.current = null;
    this.tip.hidden = true;
  }

  showTip(span) {
    const index = Number(span.dataset.index);
    this.current = span;
    this.tip.replaceChildren(...this.describe(index));
    this.tip.hidden = false;
    // Below the token (above it when there is no room below), kept inside the viewport horizontally.
    const box = span.getBoundingClientRect();
    const width = this.tip.offsetWidth;
    const height = this.tip.offsetHeight;
    const left = Math.min(Math.max(box.left, 8), Math.max(window.innerWidth - width - 8, 8));
    const above = box.bottom + height + 6 > window.innerHeight && box.top - height - 6 > 0;
    this.tip.style.left = `${left + window.scrollX}px`;
    this.tip.style.top = `${(above ? box.top - height - 6 : box.bottom + 6) + window.scrollY}px`;
  }

  describe(index) {
    const token = this.tokens[index];
    const head = element("p", "tip-head");
    head.append(element("strong", null, quoted(token.text)), ` token ${index + 1} of ${this.tokens.length}`);
    const facts = element("dl", "tip-facts");
    const probability = Math.exp(token.logprob);
    const rows = [
      ["probability", `${formatPercent(probability)} (log p ${formatNumber(token.logprob)})`],
      ["entropy", `${formatNumber(token.entropy)} nats`],
      ["TAD confidence", token.confidence === null ? "n/a (no TAD artifact)" : formatNumber(token.confidence)],
    ];
    for (const [name, value] of rows) facts.append(element("dt", null, name), element("dd", null, value));
    const shadedBy = element("p", "tip-note", `Shaded by ${MEASURES[this.measure].label}.`);
    return [head, facts, this.alternatives(token), this.attention(index), shadedBy].filter(Boolean);
  }

  alternatives(token) {
    const list = token.top_logprobs;
    if (!list || list.length === 0) return null;
    const section = element("div", "tip-alternatives");
    section.append(element("p", "tip-title", "Top alternatives at this step"));
    const ol = element("ol");
    for (const alternative of list) {
      const chosen = alternative.id === token.id;
      const item = element("li", chosen ? "chosen" : null);
      item.append(
        element("span", "alt-text", quoted(alternative.text)),
        ` ${formatPercent(Math.exp(alternative.logprob))}${chosen ? " ◀ chosen" : ""}`,
      );
      ol.append(item);
    }
    section.append(ol);
    return section;
  }

  attention(index) {
    const token = this.tokens[index];
    const section = element("div", "tip-attention");
    section.append(element("p", "tip-title", "Attention to the previous tokens (the row TAD reads)"));
    const lags = token.attention;
    if (!lags) {
      const why = index === 0 ? "the first token: TAD uses its probability (c₁ = p₁)" : "not available";
      section.append(element("p", "tip-note", why));
      return section;
    }
    if (lags.every((value) => value === null)) {
      section.append(element("p", "tip-note", "the first token: TAD uses its probability (c₁ = p₁)"));
      return section;
    }
    const strongest = Math.max(...lags.filter((value) => value !== null), 1e-9);
    const strip = element("div", "strip");
    strip.setAttribute("role", "list");
    // Oldest on the left, the token just before on the right: the order of the text.
    for (let lag = lags.length; lag >= 1; lag -= 1) {
      const value = lags[lag - 1];
      const earlier = this.tokens[index - lag];
      const cell = element("div", value === null ? "cell cell-none" : "cell");
      cell.setAttribute("role", "listitem");
      const weight = element("span", "cell-value", value === null ? "–" : value.toFixed(2));
      if (value !== null) {
        const strength = value / strongest;
        weight.style.backgroundColor = `rgba(8, 81, 156, ${(0.08 + 0.92 * strength).toFixed(3)})`;
        if (strength > 0.55) weight.classList.add("on-dark");
      }
      const label = value === null || !earlier ? "(before)" : quoted(earlier.text).slice(0, 10);
      cell.append(weight, element("span", "cell-label", label));
      cell.setAttribute("aria-label", `${lag} back: ${value === null ? "before the answer" : value.toFixed(3)}`);
      strip.append(cell);
    }
    section.append(strip);
    section.append(element("p", "tip-note", "mean over layers and heads; darker = more attention (relative to this row's largest)"));
    return section;
  }
}
