/*
 * The chat page in the browser: sends messages through htmx, streams each answer over SSE
 * into its bubble, renders answers as safe Markdown, and keeps the composer and the error
 * banner honest (nothing the user typed is lost when the server refuses a message).
 * No framework: plain DOM, one small function per job.
 */
(() => {
  "use strict";

  // ---------------------------------------------------------------------------------------
  // Markdown: escape every character of HTML first, then add only our own tags.
  // ---------------------------------------------------------------------------------------

  const HTML_ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const FENCE_OPEN = /^ {0,3}(`{3,}|~{3,})[ \t]*([^`\s]*)[^`]*$/;
  const HEADING = /^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$/;
  const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
  const QUOTE = /^ {0,3}&gt; ?(.*)$/;
  const LIST_ITEM = /^( *)([-*+]|\d{1,9}[.)])(?:([ \t]+)(.*))?$/;
  const PLACEHOLDER = /\u0000(\d+)\u0000/g;

  function escapeHtml(text) {
    return text.replace(/[&<>"']/g, (char) => HTML_ESCAPES[char]);
  }

  /** Markdown source → HTML in which every tag and attribute was written by this function. */
  function renderMarkdown(source) {
    // NUL marks placeholders in renderInline, so it may not come from the text itself.
    const normalised = String(source).replace(/\r\n?/g, "\n").replace(/\u0000/g, "\uFFFD");
    return renderBlocks(escapeHtml(normalised).split("\n"));
  }

  function isBlank(line) {
    return line.trim() === "";
  }

  function indentOf(line) {
    return line.length - line.trimStart().length;
  }

  function startsBlock(line) {
    return (
      FENCE_OPEN.test(line) || HEADING.test(line) || RULE.test(line) ||
      QUOTE.test(line) || LIST_ITEM.test(line)
    );
  }

  /** Renders lines (already HTML-escaped) as a sequence of blocks. */
  function renderBlocks(lines, tight = false) {
    const html = [];
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (isBlank(line)) {
        i += 1;
      } else if (FENCE_OPEN.test(line)) {
        i = renderFence(lines, i, html);
      } else if (HEADING.test(line)) {
        const [, hashes, text] = HEADING.exec(line);
        // Headings inside a bubble sit below the page's own h1/h2.
        const level = Math.min(hashes.length + 2, 6);
        html.push(`<h${level}>${renderInline(text)}</h${level}>`);
        i += 1;
      } else if (RULE.test(line)) {
        html.push("<hr>");
        i += 1;
      } else if (QUOTE.test(line)) {
        i = renderQuote(lines, i, html);
      } else if (LIST_ITEM.test(line)) {
        i = renderList(lines, i, html);
      } else {
        i = renderParagraph(lines, i, html, tight);
      }
    }
    return html.join("");
  }

  function renderFence(lines, start, html) {
    const [, fence, info] = FENCE_OPEN.exec(lines[start]);
    const closing = new RegExp(`^ {0,3}${fence[0] === "`" ? "`" : "~"}{${fence.length},}[ \\t]*$`);
    let end = start + 1;
    while (end < lines.length && !closing.test(lines[end])) end += 1;
    const language = /^[\w+#.-]+$/.test(info) ? ` class="language-${info}"` : "";
    // An unclosed fence (still streaming) runs to the end of the text.
    html.push(`<pre><code${language}>${lines.slice(start + 1, end).join("\n")}</code></pre>`);
    return end + 1;
  }

  function renderQuote(lines, start, html) {
    const inner = [];
    let i = start;
    while (i < lines.length && QUOTE.test(lines[i])) {
      inner.push(QUOTE.exec(lines[i])[1]);
      i += 1;
    }
    html.push(`<blockquote>${renderBlocks(inner)}</blockquote>`);
    return i;
  }

  function renderParagraph(lines, start, html, tight) {
    const text = [];
    let i = start;
    while (i < lines.length && !isBlank(lines[i]) && (i === start || !startsBlock(lines[i]))) {
      text.push(lines[i].trim());
      i += 1;
    }
    const inline = renderInline(text.join("\n")).replace(/\n/g, "<br>");
    html.push(tight ? inline : `<p>${inline}</p>`);
    return i;
  }

  function listKind(marker) {
    return /\d/.test(marker) ? "ol" : "ul";
  }

  /**
   * A list and its items. A line belongs to the current item when it is indented deeper than
   * the item's marker (so 2- and 4-space nesting both work) or continues its paragraph lazily.
   */
  function renderList(lines, start, html) {
    const [, , firstMarker] = LIST_ITEM.exec(lines[start]);
    const kind = listKind(firstMarker);
    const items = [];
    let item = null;
    let i = start;
    while (i < lines.length) {
      const line = lines[i];
      const match = LIST_ITEM.exec(line);
      const markerIndent = item ? item.markerIndent : indentOf(lines[start]);
      if (match && indentOf(line) <= markerIndent && !RULE.test(line)) {
        if (listKind(match[2]) !== kind) break;
        const gap = match[3] ? match[3].length : 1;
        item = {
          markerIndent: match[1].length,
          contentIndent: match[1].length + match[2].length + (gap > 4 ? 1 : gap),
          lines: [match[4] || ""],
          loose: false,
        };
        items.push(item);
        i += 1;
      } else if (isBlank(line)) {
        const next = lines.slice(i + 1).find((candidate) => !isBlank(candidate));
        const continues = next !== undefined && (
          indentOf(next) > markerIndent ||
          (LIST_ITEM.test(next) && listKind(LIST_ITEM.exec(next)[2]) === kind)
        );
        if (!continues) break;
        if (next !== undefined && indentOf(next) > markerIndent) item.loose = true;
        item.lines.push("");
        i += 1;
      } else if (indentOf(line) > markerIndent) {
        item.lines.push(line.slice(Math.min(indentOf(line), item.contentIndent)));
        i += 1;
      } else if (!startsBlock(line) && !isBlank(lines[i - 1])) {
        item.lines.push(line);
        i += 1;
      } else {
        break;
      }
    }
    const number = parseInt(firstMarker, 10);
    const startAttribute = kind === "ol" && number !== 1 ? ` start="${number}"` : "";
    const body = items.map((it) => `<li>${renderBlocks(it.lines, !it.loose)}</li>`).join("");
    html.push(`<${kind}${startAttribute}>${body}</${kind}>`);
    return i;
  }

  function linkHtml(url, label) {
    return `<a href="${url}" target="_blank" rel="noopener noreferrer">${label}</a>`;
  }

  /** Splits trailing punctuation off a bare URL ("see https://x.org/a)." → "https://x.org/a"). */
  function trimUrl(url) {
    let end = url.length;
    while (end > 0) {
      const char = url[end - 1];
      const opens = url.slice(0, end).split("(").length - 1;
      const closes = url.slice(0, end).split(")").length - 1;
      if (".,;:!?*_]".includes(char) || (char === ")" && closes > opens)) end -= 1;
      else break;
    }
    return [url.slice(0, end), url.slice(end)];
  }

  /** Inline Markdown on escaped text; code, links and emphasis are stashed so they nest cleanly. */
  function renderInline(text) {
    const stash = [];
    const keep = (html) => `\u0000${stash.push(html) - 1}\u0000`;

    let out = text.replace(/(`+)(?!`)([\s\S]*?[^`])\1(?!`)/g,
      (_, ticks, code) => keep(`<code>${code.replace(/^ ([\s\S]*) $/, "$1")}</code>`));
    out = out.replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s()]+(?:\([^\s()]*\)[^\s()]*)*)\)/g,
      (_, label, url) => keep(linkHtml(url, renderEmphasis(label, keep))));
    // In escaped text a raw "&" only survives as "&amp;": any other entity ends a bare URL.
    out = out.replace(/\bhttps?:\/\/(?:[^\s&\u0000]|&amp;)+/g, (match) => {
      const [url, rest] = trimUrl(match);
      return url.includes("://") && url.length > url.indexOf("://") + 3
        ? keep(linkHtml(url, url)) + rest
        : match;
    });
    out = renderEmphasis(out, keep);

    const restore = (html) => html.replace(PLACEHOLDER, (_, i) => restore(stash[Number(i)]));
    return restore(out);
  }

  function renderEmphasis(text, keep) {
    const wrap = (tag) => (match, before, inner) =>
      `${before}${keep(`<${tag}>${renderEmphasis(inner, keep)}</${tag}>`)}`;
    return text
      .replace(/\*\*\*(?=\S)([\s\S]*?\S)\*\*\*/g, (_, inner) =>
        keep(`<strong><em>${renderEmphasis(inner, keep)}</em></strong>`))
      .replace(/()\*\*(?=\S)([\s\S]*?\S)\*\*/g, wrap("strong"))
      .replace(/(^|[^\w])__(?=\S)([\s\S]*?\S)__(?!\w)/g, wrap("strong"))
      .replace(/()~~(?=\S)([\s\S]*?\S)~~/g, wrap("del"))
      .replace(/()\*(?=[^\s*])([\s\S]*?[^\s*])\*/g, wrap("em"))
      .replace(/(^|[^\w])_(?=[^\s_])([\s\S]*?[^\s_])_(?!\w)/g, wrap("em"));
  }

  // ---------------------------------------------------------------------------------------
  // Page elements and small helpers.
  // ---------------------------------------------------------------------------------------

  const page = {};

  function csrfToken() {
    const meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.content : "";
  }

  function parseJson(text) {
    try {
      return JSON.parse(text);
    } catch {
      return null;
    }
  }

  function isNearBottom() {
    const box = page.scroller;
    return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  }

  function scrollToBottom() {
    page.scroller.scrollTop = page.scroller.scrollHeight;
  }

  /** Runs a DOM change and keeps the view pinned to the newest text if it was there before. */
  function keepingScroll(change) {
    const pinned = isNearBottom();
    change();
    if (pinned) scrollToBottom();
  }

  // ---------------------------------------------------------------------------------------
  // Error banner.
  // ---------------------------------------------------------------------------------------

  function showError(message) {
    page.bannerText.textContent = message;
    page.banner.hidden = false;
  }

  function hideError() {
    page.banner.hidden = true;
    page.bannerText.textContent = "";
  }

  /** Retry-After is seconds (or, rarely, an HTTP date); null when absent or unreadable. */
  function retryAfterSeconds(header) {
    if (!header) return null;
    if (/^\d+$/.test(header.trim())) return Math.max(1, Number(header.trim()));
    const date = Date.parse(header);
    return Number.isNaN(date) ? null : Math.max(1, Math.ceil((date - Date.now()) / 1000));
  }

  const FALLBACK_ERRORS = {
    403: "Your session has expired. Reload the page and try again.",
    404: "This conversation no longer exists. Start a new chat.",
    409: "An answer is still being written. Wait for it to finish, or press Stop.",
    429: "You are sending messages too quickly.",
    503: "We are very busy right now.",
  };

  /** The user-facing text for a refused POST: the server's message plus when to retry. */
  function errorMessageFor(status, body, retryAfterHeader) {
    const payload = parseJson(body);
    const serverMessage = payload && payload.error && payload.error.message;
    let message = serverMessage || FALLBACK_ERRORS[status] ||
      `Something went wrong (HTTP ${status}). Please try again.`;
    const seconds = retryAfterSeconds(retryAfterHeader);
    if (seconds !== null) message += ` Please try again in ${seconds} s.`;
    return message;
  }

  // ---------------------------------------------------------------------------------------
  // Composer: counter, Enter to send, validation, and what happens to the text afterwards.
  // ---------------------------------------------------------------------------------------

  let sending = false;

  function characterCount(text) {
    return Array.from(text).length; // code points, as the server counts them
  }

  function updateCounter() {
    const count = characterCount(page.input.value);
    const tooLong = count > page.maxChars;
    page.counter.textContent = `${count} / ${page.maxChars}`;
    page.counter.classList.toggle("char-counter--over", tooLong);
    page.input.toggleAttribute("aria-invalid", tooLong);
  }

  function pendingAnswerExists() {
    return page.messages.querySelector('.bubble--assistant[data-status="pending"]') !== null;
  }

  /** The send button is usable only when nothing is in flight and no answer is pending. */
  function refreshComposer() {
    const pending = pendingAnswerExists();
    page.sendButton.disabled = sending || pending;
    page.hint.textContent = pending
      ? "Wait for the answer to finish, or press Stop."
      : "Enter to send, Shift+Enter for a new line.";
  }

  /** Why the text may not be sent: null when it may, "" to refuse quietly (nothing typed). */
  function refusalReason() {
    const text = page.input.value.trim();
    if (text === "") return "";
    if (pendingAnswerExists()) return FALLBACK_ERRORS[409];
    const count = characterCount(text);
    if (count > page.maxChars) {
      return `Messages can be at most ${page.maxChars} characters (this one has ${count}).`;
    }
    return null;
  }

  function onInputKeydown(event) {
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    if (!sending) page.form.requestSubmit();
  }

  /** htmx events about the composer's request (htmx:beforeSwap fires on the target, #messages). */
  function isComposerRequest(event) {
    const detail = event.detail || {};
    const source = detail.requestConfig ? detail.requestConfig.elt : detail.elt;
    return source === page.form;
  }

  function onBeforeRequest(event) {
    if (!isComposerRequest(event)) return;
    const reason = refusalReason();
    if (reason !== null) {
      event.preventDefault();
      if (reason) showError(reason);
      page.input.focus();
      return;
    }
    hideError();
    sending = true;
    refreshComposer();
  }

  /**
   * A refused message (4xx/5xx) is shown in the banner here and marked as handled, so htmx
   * neither swaps the JSON error into the page nor logs it to the console as unhandled.
   */
  function onBeforeSwap(event) {
    if (!isComposerRequest(event)) return;
    const xhr = event.detail.xhr;
    if (xhr.status < 400) return;
    showError(errorMessageFor(xhr.status, xhr.responseText, xhr.getResponseHeader("Retry-After")));
    event.detail.shouldSwap = false;
    event.detail.isError = false;
  }

  function onAfterRequest(event) {
    if (!isComposerRequest(event)) return;
    sending = false;
    const xhr = event.detail.xhr;
    if (xhr && xhr.status >= 200 && xhr.status < 300) {
      page.input.value = "";
      updateCounter();
      scrollToBottom();
      page.input.focus();
    }
    refreshComposer();
  }

  function onSendError(event) {
    if (!isComposerRequest(event)) return;
    showError("Could not reach the server, so your message was not sent. " +
      "Check your connection and try again.");
  }

  // ---------------------------------------------------------------------------------------
  // Assistant bubbles: render stored answers, stream pending ones.
  // ---------------------------------------------------------------------------------------

  const answers = new WeakMap(); // bubble element → its answer state
  const RECONNECT_DELAYS_MS = [1000, 2000, 4000, 8000];
  const MAX_RESYNCS = 3;

  function createAnswer(bubble) {
    return {
      bubble,
      content: bubble.querySelector(".bubble__content"),
      status: bubble.querySelector(".bubble__status"),
      error: bubble.querySelector(".bubble__error"),
      stopButton: bubble.querySelector(".stop-button"),
      text: "",
      tokensShown: 0, // tokens of the current attempt already appended
      statusText: bubble.querySelector(".bubble__status").textContent,
      source: null,
      renderScheduled: false,
      finished: false,
      reconnects: 0,
      resyncs: 0,
    };
  }

  function setupBubble(bubble) {
    if (answers.has(bubble)) return;
    const answer = createAnswer(bubble);
    answers.set(bubble, answer);
    if (bubble.dataset.status !== "pending") {
      answer.text = answer.content.textContent;
      answer.finished = true;
      renderNow(answer);
      return;
    }
    if (answer.stopButton) answer.stopButton.addEventListener("click", () => requestStop(answer));
    // From the beginning, without Last-Event-ID: the replay rebuilds the text exactly once.
    openStream(answer);
  }

  function setupBubbles() {
    page.messages.querySelectorAll(".bubble--assistant").forEach(setupBubble);
    refreshComposer();
  }

  function renderNow(answer) {
    answer.renderScheduled = false;
    keepingScroll(() => {
      answer.content.innerHTML = renderMarkdown(answer.text);
      answer.content.classList.add("markdown--rendered");
    });
  }

  /** Streaming re-renders at most once per frame, however fast tokens arrive. */
  function scheduleRender(answer) {
    if (answer.renderScheduled) return;
    answer.renderScheduled = true;
    requestAnimationFrame(() => {
      if (answer.renderScheduled) renderNow(answer);
    });
  }

  function showStatus(answer, text) {
    answer.status.textContent = text;
  }

  function setPhase(answer, text) {
    answer.statusText = text;
    showStatus(answer, text);
  }

  function setStreaming(answer, streaming) {
    answer.bubble.classList.toggle("bubble--streaming", streaming);
  }

  function formatWait(seconds) {
    if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "";
    return `, about ${Math.max(1, Math.round(seconds))} s`;
  }

  function openStream(answer) {
    const source = new EventSource(answer.bubble.dataset.streamUrl);
    answer.source = source;
    const on = (type, handler) => source.addEventListener(type, (event) => {
      if (answer.source !== source || answer.finished) return;
      answer.reconnects = 0;
      handler(answer, parseJson(event.data) || {});
    });
    on("status", onStatusEvent);
    on("token", onTokenEvent);
    on("reset", onResetEvent);
    on("done", onDoneEvent);
    source.addEventListener("open", () => {
      if (answer.source === source && !answer.finished) showStatus(answer, answer.statusText);
    });
    // A server-sent `event: error` and a lost connection share the name "error".
    source.addEventListener("error", (event) => {
      if (answer.source !== source || answer.finished) return;
      if (event instanceof MessageEvent) onServerErrorEvent(answer, parseJson(event.data) || {});
      else onConnectionLost(answer, source);
    });
  }

  /** Starts the stream over from its first event, forgetting what was shown. */
  function restartStream(answer) {
    if (answer.source) answer.source.close();
    answer.text = "";
    answer.tokensShown = 0;
    renderNow(answer);
    openStream(answer);
  }

  function onStatusEvent(answer, data) {
    if (data.state === "queued") {
      const position = Number.isFinite(data.position) ? ` — position ${data.position}` : "";
      setPhase(answer, `Queued${position}${formatWait(data.eta_s)}`);
      setStreaming(answer, false);
    } else if (data.state === "starting" || data.state === "running") {
      setPhase(answer, answer.tokensShown > 0 ? "" : "Thinking…");
      setStreaming(answer, data.state === "running");
    }
    answer.bubble.dataset.phase = data.state || "";
  }

  function onTokenEvent(answer, data) {
    if (data.seq === answer.tokensShown && typeof data.text === "string") {
      answer.text += data.text;
      answer.tokensShown += 1;
      if (answer.statusText) setPhase(answer, "");
      setStreaming(answer, true);
      answer.bubble.dataset.phase = "streaming";
      scheduleRender(answer);
    } else if (data.seq > answer.tokensShown && answer.resyncs < MAX_RESYNCS) {
      // A gap means events went missing: replay the whole stream rather than show a hole.
      answer.resyncs += 1;
      restartStream(answer);
    }
    // A seq below tokensShown is a duplicate and is ignored.
  }

  function onResetEvent(answer) {
    answer.text = "";
    answer.tokensShown = 0;
    renderNow(answer);
    setPhase(answer, "Restarting the answer…");
    setStreaming(answer, false);
    answer.bubble.dataset.phase = "reset";
  }

  function onDoneEvent(answer, data) {
    const timings = data.timings || {};
    if (typeof timings.engine === "string" && timings.engine.startsWith("simulated")) {
      answer.bubble.querySelector(".bubble__simulated").hidden = false;
    }
    const reason = data.finish_reason || "stop";
    answer.bubble.dataset.finishReason = reason;
    if (reason === "cancelled") {
      finishAnswer(answer, "cancelled", "Stopped");
    } else if (reason === "length") {
      finishAnswer(answer, "done", "Cut off at the length limit.");
    } else {
      finishAnswer(answer, "done", answer.text.trim() ? "" : "The assistant returned no text.");
    }
  }

  function onServerErrorEvent(answer, data) {
    if (data.code) answer.bubble.dataset.errorCode = data.code;
    showAnswerError(answer, data.message || "Something went wrong while writing this answer.");
  }

  /** EventSource retries by itself while CONNECTING; once CLOSED, we start over a few times. */
  function onConnectionLost(answer, source) {
    if (source.readyState !== EventSource.CLOSED) {
      showStatus(answer, "Connection lost — reconnecting…");
      return;
    }
    if (answer.reconnects >= RECONNECT_DELAYS_MS.length) {
      source.close();
      showAnswerError(answer, "Lost the connection to this answer. Reload the page to see it.");
      return;
    }
    showStatus(answer, "Connection lost — reconnecting…");
    const delay = RECONNECT_DELAYS_MS[answer.reconnects];
    answer.reconnects += 1;
    answer.source = null;
    setTimeout(() => {
      if (!answer.finished) restartStream(answer);
    }, delay);
  }

  function showAnswerError(answer, message) {
    answer.error.textContent = message;
    answer.error.hidden = false;
    finishAnswer(answer, "error", "");
  }

  /** The answer reached its end: close the stream (or it reconnects forever) and tidy up. */
  function finishAnswer(answer, status, statusText) {
    answer.finished = true;
    if (answer.source) answer.source.close();
    answer.source = null;
    renderNow(answer);
    setPhase(answer, statusText);
    setStreaming(answer, false);
    delete answer.bubble.dataset.phase;
    answer.bubble.dataset.status = status;
    answer.bubble.removeAttribute("aria-busy");
    if (answer.stopButton) answer.stopButton.remove();
    const feedback = answer.bubble.querySelector(".feedback");
    if (feedback && status === "done") feedback.hidden = false;
    refreshComposer();
  }

  /** Asks the server to stop; the stream stays open until its `done` (cancelled) arrives. */
  async function requestStop(answer) {
    const button = answer.stopButton;
    button.disabled = true;
    button.textContent = "Stopping…";
    try {
      const response = await fetch(answer.bubble.dataset.cancelUrl, {
        method: "POST",
        headers: { "X-CSRFToken": csrfToken() },
        credentials: "same-origin",
      });
      if (!response.ok) {
        const payload = parseJson(await response.text());
        const message = payload && payload.error && payload.error.message;
        throw new Error(message || `The server answered HTTP ${response.status}.`);
      }
    } catch (error) {
      if (answer.finished) return;
      button.disabled = false;
      button.textContent = "Stop";
      const detail = error instanceof TypeError ? "Could not reach the server." : error.message;
      showError(`Could not stop the answer. ${detail}`);
    }
  }

  // ---------------------------------------------------------------------------------------
  // Wiring.
  // ---------------------------------------------------------------------------------------

  function init() {
    page.form = document.getElementById("message-form");
    if (!page.form) return;
    page.input = document.getElementById("message-input");
    page.sendButton = document.getElementById("send-button");
    page.messages = document.getElementById("messages");
    page.scroller = document.getElementById("chat-scroll") || page.messages;
    page.counter = document.getElementById("char-counter");
    page.hint = document.getElementById("composer-hint");
    page.banner = document.getElementById("error-banner");
    page.bannerText = page.banner.querySelector(".error-banner__text");
    page.maxChars = Number(page.form.dataset.maxChars) || 4000;

    page.banner.querySelector(".error-banner__dismiss").addEventListener("click", hideError);
    page.input.addEventListener("input", updateCounter);
    page.input.addEventListener("keydown", onInputKeydown);
    document.body.addEventListener("htmx:beforeRequest", onBeforeRequest);
    document.body.addEventListener("htmx:afterRequest", onAfterRequest);
    document.body.addEventListener("htmx:beforeSwap", onBeforeSwap);
    document.body.addEventListener("htmx:sendError", onSendError);
    document.body.addEventListener("htmx:timeout", onSendError);
    // New bubbles arrive through htmx swaps; setupBubble skips the ones it already knows.
    document.body.addEventListener("htmx:afterSwap", setupBubbles);

    // A page restored from the back/forward cache has lost its streams: load it afresh.
    window.addEventListener("pageshow", (event) => {
      if (event.persisted && pendingAnswerExists()) window.location.reload();
    });

    updateCounter();
    setupBubbles();
    scrollToBottom();
  }

  // A hook for browser tests of the renderer; the page itself does not need it.
  window.SupportChat = { renderMarkdown };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
