// The artifact's calibration: coverage against error among accepted, one point per calibrated target
// of a method (the active one marked), a table with the same numbers, and the report's rejection curves.

import { blobUrl, describeError, getJson } from "./api.js";
import { formatNumber, formatPercent } from "./scale.js";
import { entryWords } from "./verdict.js";

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 360;
const HEIGHT = 260;
const PAD = { left: 48, right: 16, top: 14, bottom: 40 };

function svg(tag, attributes = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

const x = (coverage) => PAD.left + coverage * (WIDTH - PAD.left - PAD.right);
const y = (error) => HEIGHT - PAD.bottom - error * (HEIGHT - PAD.top - PAD.bottom);

function axes(chart) {
  for (const tick of [0, 0.25, 0.5, 0.75, 1]) {
    chart.append(svg("line", { x1: x(tick), x2: x(tick), y1: y(0), y2: y(1), class: "gridline" }));
    chart.append(svg("line", { x1: x(0), x2: x(1), y1: y(tick), y2: y(tick), class: "gridline" }));
    chart.append(svg("text", { x: x(tick), y: y(0) + 16, class: "tick", "text-anchor": "middle" }, `${tick * 100}%`));
    chart.append(svg("text", { x: x(0) - 6, y: y(tick) + 4, class: "tick", "text-anchor": "end" }, `${tick * 100}%`));
  }
  chart.append(
    svg("text", { x: (x(0) + x(1)) / 2, y: HEIGHT - 6, class: "axis", "text-anchor": "middle" }, "coverage (share accepted)"),
  );
  const yLabel = svg("text", { x: 12, y: (y(0) + y(1)) / 2, class: "axis", "text-anchor": "middle" }, "error among accepted");
  yLabel.setAttribute("transform", `rotate(-90 12 ${(y(0) + y(1)) / 2})`);
  chart.append(yLabel);
}

function chartOf(entries, active) {
  const chart = svg("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, class: "calibration-chart", role: "img" });
  chart.append(svg("title", {}, "Coverage against error among accepted answers, one point per calibrated target"));
  axes(chart);
  const sorted = [...entries].sort((a, b) => a[1].coverage - b[1].coverage);
  if (sorted.length > 1) {
    const points = sorted.map(([, e]) => `${x(e.coverage).toFixed(1)},${y(e.error).toFixed(1)}`).join(" ");
    chart.append(svg("polyline", { points, class: "curve" }));
  }
  for (const [name, entry] of sorted) {
    const isActive = name === active;
    const kind = entry.kind === "error" ? "point-error" : "point-coverage";
    const cx = x(entry.coverage);
    const cy = y(entry.error);
    const group = svg("g", { class: isActive ? "point active" : "point" });
    // Shape as well as colour: error targets are diamonds, coverage targets circles.
    if (entry.kind === "error") {
      group.append(svg("rect", { x: cx - 5, y: cy - 5, width: 10, height: 10, transform: `rotate(45 ${cx} ${cy})`, class: kind }));
    } else {
      group.append(svg("circle", { cx, cy, r: 5, class: kind }));
    }
    if (isActive) group.append(svg("circle", { cx, cy, r: 10, class: "ring" }));
    // Points sit close together: each is labelled with its target value only (the shape tells the kind,
    // the table below has the full names); the active one gets its full name.
    const label = isActive ? `${name} (active)` : formatPercent(entry.target, 0);
    group.append(svg("text", { x: cx + 7, y: isActive ? cy + 20 : Math.max(cy - 8, 10), class: isActive ? "label active" : "label" }, label));
    group.append(svg("title", {}, `${name}: coverage ${formatPercent(entry.coverage)}, error ${formatPercent(entry.error)}`));
    chart.append(group);
  }
  return chart;
}

function tableOf(entries, active) {
  const table = element("table", "calibration-table");
  table.append(element("caption", null, "Calibrated thresholds"));
  const head = element("tr");
  for (const name of ["target", "threshold", "coverage", "error among accepted", "what it means"]) {
    head.append(element("th", null, name));
  }
  table.append(head);
  for (const [name, entry] of entries) {
    const row = element("tr", name === active ? "active" : null);
    if (name === active) row.setAttribute("aria-current", "true");
    row.append(
      element("td", null, name === active ? `${name} ◀ active` : name),
      element("td", null, formatNumber(entry.threshold)),
      element("td", null, formatPercent(entry.coverage)),
      element("td", null, formatPercent(entry.error)),
      element("td", null, entryWords(entry)),
    );
    table.append(row);
  }
  return table;
}

/** The chart and table for one method; `active` is the target in use (null: none of them). */
export function renderCalibration(container, info, method, active) {
  const entries = Object.entries(info.artifact?.thresholds?.[method] ?? {});
  if (!info.artifact) {
    container.replaceChildren(element("p", "hint", "No TAD artifact is loaded: nothing is calibrated."));
    return;
  }
  if (entries.length === 0) {
    container.replaceChildren(element("p", "hint", `The artifact calibrated no thresholds for ${method}.`));
    return;
  }
  const note = element("p", "hint", `Method ${method}; diamonds: error targets (with a guarantee), circles: coverage targets.`);
  container.replaceChildren(note, chartOf(entries, active), tableOf(entries, active));
}

/** The report's PNGs (rejection curves), fetched with the key header and shown from blob URLs. */
export async function renderReport(container) {
  try {
    const report = await getJson("playground/report");
    if (report.files.length === 0) {
      const why = report.artifact === null ? "No artifact is loaded: no report." : "The artifact's report has no figures.";
      container.replaceChildren(element("p", "hint", why));
      return;
    }
    const figures = await Promise.all(
      report.files.map(async (file) => {
        const figure = element("figure");
        const image = element("img");
        image.alt = `Rejection curve from the artifact's report: ${file}`;
        image.src = await blobUrl(`playground/report/${file.split("/").map(encodeURIComponent).join("/")}`);
        // Once shown, the image no longer needs its blob: free it (the page may load the report again).
        image.addEventListener("load", () => URL.revokeObjectURL(image.src), { once: true });
        figure.append(image, element("figcaption", null, file));
        return figure;
      }),
    );
    container.replaceChildren(...figures);
  } catch (error) {
    container.replaceChildren(element("p", "error-text", `The report's figures could not be loaded. ${describeError(error)}`));
  }
}
