/*
 * The composer: the message form (sent by htmx), its length limit and counter, Enter to send,
 * the Stop button of a pending answer, and the error banner. Nothing the user typed is lost
 * when the server refuses a message.
 */
import { scrollToBottom } from "./rendering.js";

const FALLBACK_ERRORS = {
  403: "Your session has expired. Reload the page and try again.",
  404: "This conversation no longer exists. Start a new chat.",
  409: "An answer is still being written. Wait for it to finish, or press Stop.",
  429: "You are sending messages too quickly.",
  503: "We are very busy right now.",
};

const page = {};
let sending = false;

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

/** The user-facing text for a refused POST: the server's message plus when to retry. */
function errorMessageFor(status, body, retryAfterHeader) {
  const payload = parseJson(body);
  const serverMessage = payload && payload.error && payload.error.message;
  let message =
    serverMessage || FALLBACK_ERRORS[status] || `Something went wrong (HTTP ${status}). Please try again.`;
  const seconds = retryAfterSeconds(retryAfterHeader);
  if (seconds !== null) message += ` Please try again in ${seconds} s.`;
  return message;
}

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

export function pendingAnswerExists() {
  return page.messages.querySelector('.bubble--assistant[data-status="pending"]') !== null;
}

/** The send button is usable only when nothing is in flight and no answer is pending. */
export function refreshComposer() {
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
  showError(
    "Could not reach the server, so your message was not sent. Check your connection and try again.",
  );
}

/** Asks the server to stop; the stream stays open until its `done` (cancelled) arrives. */
async function requestStop(bubble, button) {
  button.disabled = true;
  button.textContent = "Stopping…";
  try {
    const response = await fetch(bubble.dataset.cancelUrl, {
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
    // The answer may have ended meanwhile, and taken its Stop button with it.
    if (!button.isConnected) return;
    button.disabled = false;
    button.textContent = "Stop";
    const detail = error instanceof TypeError ? "Could not reach the server." : error.message;
    showError(`Could not stop the answer. ${detail}`);
  }
}

/** Wires the Stop button of a pending answer's bubble. */
export function watchStopButton(bubble) {
  const button = bubble.querySelector(".stop-button");
  if (button) button.addEventListener("click", () => requestStop(bubble, button));
}

/** Wires the form on this page; false when the page has no composer. */
export function attachComposer() {
  page.form = document.getElementById("message-form");
  if (!page.form) return false;
  page.input = document.getElementById("message-input");
  page.sendButton = document.getElementById("send-button");
  page.messages = document.getElementById("messages");
  page.counter = document.getElementById("char-counter");
  page.hint = document.getElementById("composer-hint");
  page.banner = document.getElementById("error-banner");
  page.bannerText = page.banner.querySelector(".error-banner__text");
  // The server's limit (CHAT_MAX_MESSAGE_CHARS), written into the form by the page.
  page.maxChars = Number(page.form.dataset.maxChars);

  page.banner.querySelector(".error-banner__dismiss").addEventListener("click", hideError);
  page.input.addEventListener("input", updateCounter);
  page.input.addEventListener("keydown", onInputKeydown);
  document.body.addEventListener("htmx:beforeRequest", onBeforeRequest);
  document.body.addEventListener("htmx:afterRequest", onAfterRequest);
  document.body.addEventListener("htmx:beforeSwap", onBeforeSwap);
  document.body.addEventListener("htmx:sendError", onSendError);
  document.body.addEventListener("htmx:timeout", onSendError);
  updateCounter();
  return true;
}
