/*
 * The console in the browser: keeps the dashboard's live region current from the console's
 * socket, whose snapshots are data put into the page as text (falling back to htmx polling
 * while the socket is down), draws the 15-minute charts as
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

  const POLL_MS = 2000;

  /** Poll only while the socket is not delivering. */
  const liveNeedsPoll = () =>
    document.visibilityState === "visible" && !(socket && socket.readyState === WebSocket.OPEN);

  /**
   * The htmx fallback poll: the summary asks for the live region on `console-poll`. Triggered
   * from here rather than by an `hx-trigger` filter expression, which htmx evaluates as code:
   * the Content-Security-Policy allows scripts from this site's files only.
   */
  function pollWhileNeeded() {
    window.setInterval(() => {
      const summary = document.getElementById("live-summary");
      if (summary && window.htmx && liveNeedsPoll()) window.htmx.trigger(summary, "console-poll");
    }, POLL_MS);
  }

  function showLiveMode(mode) {
    const status = document.getElementById("live-status");
    if (!status) return;
    status.dataset.live = mode;
    status.textContent = mode === "socket"
      ? "Live: updates every second. Rates and latencies cover the last 5 minutes."
      : "Reconnecting; meanwhile refreshes every 2 seconds. Rates and latencies cover the last 5 minutes.";
  }

  /** An element with attributes and children; strings become text, never markup. */
  function element(name, attributes = {}, ...children) {
    const made = document.createElement(name);
    Object.entries(attributes).forEach(([key, value]) => made.setAttribute(key, value));
    made.append(...children.flat().filter((child) => child !== null && child !== undefined && child !== false));
    return made;
  }

  const SIMULATED_TITLE = "A cost model of a GPU for tests and benchmarks, not a real model";
  const PAUSED_TITLE = "Answers paused for a VIP one; each resumes where it was";
  const VIP_TITLE = "A VIP request claimed by this worker, waiting for a slot to turn over or for an answer to be paused for it";
  const GPU_TITLE = "GPU memory in use";
  const NO_GPU_TITLE = "No GPU: the engine process's resident memory, of the machine's";
  const SPARE_TITLE = "Engine loaded; claims nothing until its model needs another worker";
  const DESIRED_TITLE = "What the autoscaler is asked for (llm_workers_desired): admitted arrivals and the queue over what a worker finishes per second";
  const SPARES_TITLE = "Workers with the engine loaded that claim nothing until its model needs more than its serving workers";

  function queueRow(row) {
    return element(
      "tr",
      { "data-model": row.model, "data-tier": row.tier, ...(row.queued ? { class: "row--busy" } : {}) },
      element("td", {}, row.model),
      element("td", {}, row.tier),
      element("td", { class: "num", "data-queued": "" }, String(row.queued)),
      element("td", { class: "num" }, row.predicted_wait),
      element("td", { class: "num" }, row.drain_rate),
    );
  }

  function refusalsBlock(refusals) {
    if (!refusals.length) return element("p", { class: "empty" }, "Nothing refused in the last 5 minutes.");
    return element(
      "table",
      { class: "table" },
      element("thead", {}, element("tr", {},
        element("th", { scope: "col" }, "Reason"),
        element("th", { scope: "col", class: "num" }, "Per minute"))),
      element("tbody", {}, refusals.map((row) => element("tr", {},
        element("td", { class: "mono" }, row.reason),
        element("td", { class: "num" }, row.per_min)))),
    );
  }

  function workerActions(worker) {
    if (worker.draining) return element("span", { class: "pill pill--warn" }, "draining");
    const form = element(
      "form",
      { method: "post", action: worker.drain_url },
      element("button", { type: "submit", class: "button button--small", id: `drain-${worker.worker_id}` }, "Drain"),
    );
    form.dataset.confirm = `Drain ${worker.worker_id}? It finishes its running answers, takes no new ones and stops.`;
    return [worker.spare ? element("span", { class: "pill", title: SPARE_TITLE }, "warm spare") : null, form];
  }

  function workerRow(worker) {
    return element(
      "tr",
      {},
      element("td", { class: "mono" }, worker.worker_id),
      element("td", {}, worker.model),
      element("td", {}, worker.simulated
        ? element("span", { class: "pill pill--simulated", title: SIMULATED_TITLE }, "simulated")
        : worker.engine),
      element("td", { class: "num" },
        worker.running,
        worker.paused ? [element("br"), element("span", { class: "muted", title: PAUSED_TITLE }, `${worker.paused} paused`)] : null,
        worker.vip_waiting ? [element("br"), element("span", { class: "muted", title: VIP_TITLE }, "VIP waiting for a slot")] : null),
      element("td", { class: "num" }, worker.kv_cache),
      element("td", {},
        `${worker.memory} `,
        element("span", { class: "pill", title: worker.on_gpu ? GPU_TITLE : NO_GPU_TITLE },
          worker.on_gpu ? "GPU" : "engine process, no GPU")),
      element("td", { class: "num" }, worker.heartbeat_age),
      element("td", {}, workerActions(worker)),
    );
  }

  function workersBlock(workers) {
    if (!workers.length) {
      return element("p", { class: "empty" }, "No live worker. Start one with ",
        element("code", {}, "python manage.py runworker inference"), ".");
    }
    const heads = ["Worker", "Model", "Engine", "Running / slots", "KV cache", "Memory", "Last heartbeat"];
    const numeric = new Set(["Running / slots", "KV cache", "Last heartbeat"]);
    return element("div", { class: "table-scroll" }, element(
      "table",
      { class: "table" },
      element("thead", {}, element("tr", {},
        heads.map((head) => element("th", { scope: "col", ...(numeric.has(head) ? { class: "num" } : {}) }, head)),
        element("th", { scope: "col" }, element("span", { class: "visually-hidden" }, "Actions")))),
      element("tbody", {}, workers.map(workerRow)),
    ));
  }

  function fleetLine(snapshot) {
    const models = snapshot.fleet.map((row, index) => [
      element("span", { "data-model": row.model, "data-live": String(row.live), "data-desired": String(row.desired) },
        `${row.model}: ${row.live} live, `,
        element("span", { title: DESIRED_TITLE }, `${row.desired} desired`)),
      index < snapshot.fleet.length - 1 ? " · " : null,
    ]);
    return [
      models,
      " · ",
      element("span", { id: "warm-spares", "data-spares": String(snapshot.warm_spares), title: SPARES_TITLE },
        snapshot.fields.warm_spares),
    ];
  }

  /** A snapshot is data: numbers and text put into the live region's elements as text. */
  function applySnapshot(snapshot) {
    document.querySelectorAll("#live-summary [data-field]").forEach((field) => {
      const text = snapshot.fields[field.dataset.field];
      if (typeof text === "string") field.textContent = text;
    });
    const total = document.getElementById("queue-depth-total");
    if (total) total.dataset.value = String(snapshot.queued_total);
    const refusalsTile = document.getElementById("refusals-tile");
    if (refusalsTile) refusalsTile.classList.toggle("tile--warn", snapshot.refusing);
    const replace = (id, ...children) => {
      const target = document.getElementById(id);
      if (target) target.replaceChildren(...children.flat(Infinity).filter((child) => child !== null));
    };
    replace("queues-rows", snapshot.queues.map(queueRow));
    replace("refusals-rows", refusalsBlock(snapshot.refusals));
    replace("workers-fleet", fleetLine(snapshot));
    replace("workers-rows", workersBlock(snapshot.workers));
    const charts = document.getElementById("chart-data");
    if (charts) charts.textContent = JSON.stringify(snapshot.charts);
    drawCharts();
  }

  function connectLive() {
    const scheme = window.location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(`${scheme}://${window.location.host}/console/live/socket`);
    socket.addEventListener("open", () => {
      reconnectMs = 500;
      showLiveMode("socket");
    });
    socket.addEventListener("message", (event) => applySnapshot(JSON.parse(event.data)));
    socket.addEventListener("close", () => {
      showLiveMode("poll");
      window.setTimeout(connectLive, reconnectMs);
      reconnectMs = Math.min(RECONNECT_MAX_MS, reconnectMs * 2);
    });
  }

  // --- forms ---------------------------------------------------------------------------------

  /**
   * Forms with data-confirm (drain, promote, roll back) go ahead only once confirmed. A form
   * built from a pushed snapshot (the same for every tab) carries no CSRF token: it takes this
   * page's.
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
    if (document.getElementById("live-summary")) {
      connectLive();
      pollWhileNeeded();
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
