// Per-token measures and the colour scale that shades tokens.
//
// The scale runs from blue (confident) through a neutral grey to orange (unsure): a pair that
// people with red-green colour blindness tell apart, and every shade keeps dark text readable.
// Colour is never the only cue: the two least confident bands are also underlined (dotted,
// then wavy), and every value is written out in the token's tooltip.

const STOPS = [
  [0.0, [230, 97, 1]], // #e66101 orange: unsure
  [0.25, [253, 184, 99]], // #fdb863
  [0.5, [240, 240, 240]], // #f0f0f0 neutral
  [0.75, [198, 219, 239]], // #c6dbef
  [1.0, [146, 197, 222]], // #92c5de blue: confident (light enough for dark text)
];

// Entropy is shaded on a fixed range: 0 nats (certain) .. this many nats (or more): unsure.
export const ENTROPY_RANGE = 5;

export const MEASURES = {
  tad: {
    label: "TAD confidence",
    short: "TAD c",
    legend: ["0 (unsure)", "1 (confident)"],
    value: (token) => token.confidence,
  },
  probability: {
    label: "token probability",
    short: "p",
    legend: ["0 (unlikely)", "1 (certain)"],
    value: (token) => Math.exp(token.logprob),
  },
  entropy: {
    label: "entropy",
    short: "H",
    legend: [`≥ ${ENTROPY_RANGE} nats (spread out)`, "0 nats (peaked)"],
    value: (token) => token.entropy,
  },
};

/** Where a token sits on the scale, 0 (unsure) .. 1 (confident); null when the measure is unknown. */
export function position(token, measure) {
  const value = MEASURES[measure].value(token);
  if (value === null || value === undefined || !Number.isFinite(value)) return null;
  if (measure === "entropy") return 1 - Math.min(Math.max(value / ENTROPY_RANGE, 0), 1);
  return Math.min(Math.max(value, 0), 1);
}

function mix(a, b, t) {
  return a.map((channel, i) => Math.round(channel + (b[i] - channel) * t));
}

/** The background colour for a position on the scale (a neutral hatch colour for null). */
export function shade(t) {
  if (t === null) return "rgb(255, 255, 255)";
  for (let i = 1; i < STOPS.length; i += 1) {
    const [upper, high] = STOPS[i];
    const [lower, low] = STOPS[i - 1];
    if (t <= upper) {
      const [r, g, b] = mix(low, high, (t - lower) / (upper - lower));
      return `rgb(${r}, ${g}, ${b})`;
    }
  }
  const [r, g, b] = STOPS.at(-1)[1];
  return `rgb(${r}, ${g}, ${b})`;
}

/** The band's name (a CSS class adds the non-colour cue). */
export function band(t) {
  if (t === null) return "band-none";
  if (t < 0.25) return "band-low";
  if (t < 0.5) return "band-mid";
  return "band-high";
}

/** CSS gradient stops for the legend bar. */
export function gradientStops() {
  return STOPS.map(([t, [r, g, b]]) => `rgb(${r}, ${g}, ${b}) ${Math.round(t * 100)}%`).join(", ");
}

export function formatNumber(value, digits = 3) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "n/a";
  return value.toFixed(digits);
}

export function formatPercent(value, digits = 1) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "n/a";
  return `${(value * 100).toFixed(digits)}%`;
}
