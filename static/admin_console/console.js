/*
 * The console in the browser: keeps the dashboard's live region current from the console's
 * socket (falling back to htmx polling while the socket is down), draws the 15-minute charts as
 * inline SVG from the JSON the live region carries, and asks before a drain, promotion or
 * rollback. No framework and nothing loaded from elsewhere.
 */
(() => {
  "use strict";

  const SVG_NS = "http://www.w3.org/2000/svg";
  const WIDTH = 600; // the charts' viewBox; the SVG stretches to its box, strokes do not
  const HEIGHT = 180;
  const COLOURS = ["var(--series-1)", "var(--series-2)", "var(--series-3)"];
  const AXIS_LABELS = ["−15 min", "−10 min", "−5 min", "now"];

  function chartData() {
    const element = document.getElementById("chart-data");
    return element ? JSON.parse(element.textContent) : null;
  }

  /** A chart's lines: queue depth has one per tier, the others a single one. */
  function linesOf(data, name) {
    const value = data[name];
    if (Array.isArray(value)) return [{ label: null, values: value }];
    return Object.entries(value).map(([label, values]) => ({ label, values }));
  }

  /** The smallest 1-2-2.5-5 × 10^n at or above `max`, so the scale reads in round numbers. */
  function roundedTop(max) {
    if (!(max > 0)) return 1;
    const power = 10 ** Math.floor(Math.log10(max));
    return [1, 2, 2.5, 5, 10].map((m) => m * power).find((top) => top >= max);
  }

  function formatValue(value, unit) {
    if (value === null || value === undefined) return "no data";
    if (unit === "ms") return value < 1000 ? `${Math.round(value)} ms` : `${(value / 1000).toFixed(1)} s`;
    const rounded = Number.isInteger(value) ? value : Number(value.toFixed(1));
    return `${rounded} ${unit}`;
  }

  function lastValue(values) {
    for (let i = values.length - 1; i >= 0; i -= 1) if (values[i] !== null) return values[i];
    return null;
  }

  function svgElement(name, attributes) {
    const element = document.createElementNS(SVG_NS, name);
    Object.entries(attributes).forEach(([key, value]) => element.setAttribute(key, value));
    return element;
  }

  /**
   * A path through the points that have values; a missing value breaks the line, and a point
   * alone between gaps is drawn as a short tick so it still shows.
   */
  function pathData(values, top) {
    const step = WIDTH / Math.max(1, values.length - 1);
    const known = (index) => index >= 0 && index < values.length && values[index] !== null;
    const parts = [];
    values.forEach((value, index) => {
      if (value === null) return;
      const x = index * step;
      const y = (HEIGHT - (value / top) * HEIGHT).toFixed(1);
      if (known(index - 1)) parts.push(`L${x.toFixed(1)} ${y}`);
      else if (known(index + 1)) parts.push(`M${x.toFixed(1)} ${y}`);
      else parts.push(`M${Math.max(0, x - 4).toFixed(1)} ${y} L${Math.min(WIDTH, x + 4).toFixed(1)} ${y}`);
    });
    return parts.join(" ");
  }

  /** The scale label above and the time axis below the plot, made once per chart. */
  function ensureFrame(figure) {
    const svg = figure.querySelector(".chart__plot");
    if (!figure.querySelector(".chart__scale")) {
      const scale = document.createElement("div");
      scale.className = "chart__scale";
      svg.before(scale);
      const axis = document.createElement("div");
      axis.className = "chart__axis";
      axis.setAttribute("aria-hidden", "true");
      AXIS_LABELS.forEach((label) => {
        const span = document.createElement("span");
        span.textContent = label;
        axis.append(span);
      });
      svg.after(axis);
    }
    return svg;
  }

  function drawChart(figure, data) {
    const unit = figure.dataset.unit;
    const lines = linesOf(data, figure.dataset.chart);
    const known = lines.flatMap((line) => line.values).filter((value) => value !== null);
    const top = roundedTop(Math.max(0, ...known));
    const svg = ensureFrame(figure);

    const children = [0, 0.5, 1].map((fraction) => {
      const y = (HEIGHT * fraction).toFixed(1);
      return svgElement("line", { class: "chart__grid", x1: 0, x2: WIDTH, y1: y, y2: y });
    });
    lines.forEach((line, index) => {
      const d = pathData(line.values, top);
      if (d) children.push(svgElement("path", { class: "chart__line", d, stroke: COLOURS[index % COLOURS.length] }));
    });
    svg.replaceChildren(...children);

    figure.querySelector(".chart__scale").textContent = `0 – ${formatValue(top, unit)}`;
    const legend = figure.querySelector(".chart__legend");
    legend.replaceChildren(...lines.filter((line) => line.label).map((line, index) => {
      const key = document.createElement("span");
      key.className = "chart__key";
      key.style.setProperty("--key-colour", COLOURS[index % COLOURS.length]);
      key.textContent = `${line.label} ${formatValue(lastValue(line.values), "").trim()}`;
      return key;
    }));

    const title = figure.querySelector(".chart__title").firstChild.textContent.trim();
    const now = lines.map((line) => `${line.label ? `${line.label} ` : ""}${formatValue(lastValue(line.values), unit)}`);
    const peak = known.length ? formatValue(Math.max(...known), unit) : "no data";
    svg.setAttribute("aria-label", `${title} over the last 15 minutes. Now: ${now.join(", ")}. Peak: ${peak}.`);
  }

  function drawCharts() {
    const data = chartData();
    if (!data) return;
    document.querySelectorAll("figure.chart[data-chart]").forEach((figure) => drawChart(figure, data));
  }

  // --- the live region ---------------------------------------------------------------------

  const RECONNECT_MAX_MS = 10_000;
  let socket = null;
  let reconnectMs = 500;

  /** The htmx poll's filter: poll only while the socket is not delivering. */
  window.consoleLiveNeedsPoll = () =>
    document.visibilityState === "visible" && !(socket && socket.readyState === WebSocket.OPEN);

  function showLiveMode(mode) {
    const status = document.getElementById("live-status");
    if (!status) return;
    status.dataset.live = mode;
    status.textContent = mode === "socket"
      ? "Live: updates every second. Rates and latencies cover the last 5 minutes."
      : "Reconnecting; meanwhile refreshes every 2 seconds. Rates and latencies cover the last 5 minutes.";
  }

  /** A snapshot is the live region's elements by id, as the htmx poll would swap them. */
  function applySnapshot(html) {
    const template = document.createElement("template");
    template.innerHTML = html;
    [...template.content.children].forEach((fresh) => {
      const current = fresh.id && document.getElementById(fresh.id);
      if (!current) return;
      fresh.removeAttribute("hx-swap-oob");
      current.replaceWith(fresh);
      if (window.htmx) window.htmx.process(fresh);
    });
    drawCharts();
  }

  function connectLive() {
    const scheme = window.location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(`${scheme}://${window.location.host}/console/live/socket`);
    socket.addEventListener("open", () => {
      reconnectMs = 500;
      showLiveMode("socket");
    });
    socket.addEventListener("message", (event) => applySnapshot(event.data));
    socket.addEventListener("close", () => {
      showLiveMode("poll");
      window.setTimeout(connectLive, reconnectMs);
      reconnectMs = Math.min(RECONNECT_MAX_MS, reconnectMs * 2);
    });
  }

  // --- forms ---------------------------------------------------------------------------------

  /**
   * Forms with data-confirm (drain, promote, roll back) go ahead only once confirmed. A form
   * that came in a pushed snapshot (one rendering for every tab) carries no CSRF token: it takes
   * this page's.
   */
  function onSubmit(event) {
    const form = event.target.closest("form");
    if (!form) return;
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
      return;
    }
    if (form.method === "post" && !form.elements.csrfmiddlewaretoken) {
      const token = document.createElement("input");
      token.type = "hidden";
      token.name = "csrfmiddlewaretoken";
      token.value = document.querySelector('meta[name="csrf-token"]').content;
      form.append(token);
    }
  }

  function init() {
    document.addEventListener("submit", onSubmit);
    // While the socket is down htmx polls; the chart data arrives with it, out of band.
    document.body.addEventListener("htmx:afterSettle", drawCharts);
    drawCharts();
    if (document.getElementById("live-summary")) connectLive();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
