/*
 * The hand-off to a person, on the customer's page: "Talk to a person" (the button, and its
 * offers under a decline or after a second thumbs-down), the wait (place, expected time, or
 * that nobody is online), the agent's messages and typing, the customer's own typing, going
 * back to the assistant, and the rating once a person resolved the conversation.
 *
 * The database is the record, the conversation's event stream the delivery: whenever the page
 * (re)starts following, it first reads where the hand-off stands and the messages it has not
 * shown (by id), then follows the stream from the id that read gave. A message is shown once,
 * whichever way it came.
 */

const TYPING_SEND_EVERY_MS = 3000;
const TYPING_SHOWN_MS = 5000;
const RESYNC_DELAYS_MS = [1000, 2000, 4000, 8000, 15000];

const panel = {};
let state = "assistant";
let agentName = "";
let source = null;
let resyncs = 0;
let lastTypingSent = 0;
let typingTimer = null;

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

async function post(url, body) {
  const response = await fetch(url, {
    method: "POST",
    headers: { "X-CSRFToken": csrfToken(), Accept: "application/json" },
    credentials: "same-origin",
    body,
  });
  const payload = response.status === 204 ? {} : parseJson(await response.text()) || {};
  return { response, payload };
}

function showBanner(message) {
  const banner = document.getElementById("error-banner");
  banner.querySelector(".error-banner__text").textContent = message;
  banner.hidden = false;
}

function formatWait(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "";
  if (seconds < 90) return ", about a minute";
  return `, about ${Math.round(seconds / 60)} minutes`;
}

function setStatus(text) {
  panel.status.textContent = text;
}

/** The page as the hand-off's state says: which controls show, what the status line says. */
function setState(next, agent) {
  state = next;
  if (agent) agentName = agent;
  panel.root.dataset.state = state;
  panel.request.hidden = state === "waiting" || state === "agent";
  panel.withdraw.hidden = state !== "waiting";
  if (state !== "assistant") {
    panel.offer.hidden = true;
    document.querySelectorAll(".bubble__offer").forEach((offer) => {
      offer.hidden = true;
    });
  }
  if (state === "agent") setStatus(`You are talking to ${agentName} from our team.`);
  else if (state === "resolved") setStatus(`${agentName || "Our team"} resolved this conversation.`);
  else if (state === "assistant") setStatus("");
  else if (state === "waiting" && !panel.status.textContent) setStatus("Waiting for a person from our team…");
  if (state !== "agent") hideTyping();
  const hint = document.getElementById("composer-hint");
  if (hint && (state === "waiting" || state === "agent")) {
    hint.textContent = "A person from our team reads your messages here.";
  }
}

function showWaiting(data) {
  if (data.agents_online === 0) {
    setStatus(
      "Nobody from our team is online right now. Leave your question here: " +
        "the answer will appear in this conversation when you come back.",
    );
    panel.root.dataset.nobodyOnline = "true";
    return;
  }
  delete panel.root.dataset.nobodyOnline;
  const place = Number.isFinite(data.position) ? ` You are number ${data.position} in line` : "";
  setStatus(`Waiting for a person from our team.${place}${formatWait(data.eta_s)}.`);
}

function shownMessageIds() {
  return new Set(
    Array.from(document.querySelectorAll("#messages [data-message-id]"), (el) => Number(el.dataset.messageId)),
  );
}

function lastMessageId() {
  return Math.max(0, ...shownMessageIds());
}

/** A message bubble as the server renders one (chat/_message.html), its text as text. */
function messageBubble(message) {
  const agent = message.role === "agent";
  const bubble = document.createElement("article");
  bubble.className = `bubble ${agent ? "bubble--agent" : "bubble--user"}`;
  bubble.dataset.status = "done";
  bubble.dataset.messageId = String(message.id);
  const name = agent ? message.author || "Support team" : "You";
  bubble.setAttribute("aria-label", name);
  const meta = document.createElement("header");
  meta.className = "bubble__meta";
  const author = document.createElement("span");
  author.className = "bubble__author";
  author.textContent = name;
  meta.append(author);
  if (agent) {
    const team = document.createElement("span");
    team.className = "bubble__team";
    team.textContent = "Support team";
    meta.append(team);
  }
  const content = document.createElement("div");
  content.className = "bubble__content bubble__content--plain";
  content.textContent = message.text;
  bubble.append(meta, content);
  return bubble;
}

function showMessage(message) {
  if (shownMessageIds().has(message.id)) return;
  const list = document.getElementById("messages");
  const box = document.getElementById("chat-scroll") || list;
  const pinned = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  list.append(messageBubble(message));
  if (pinned) box.scrollTop = box.scrollHeight;
  if (message.role === "agent") hideTyping();
}

function showTyping(author) {
  panel.typing.textContent = `${author || "Our team"} is typing…`;
  panel.typing.hidden = false;
  clearTimeout(typingTimer);
  typingTimer = setTimeout(hideTyping, TYPING_SHOWN_MS);
}

function hideTyping() {
  clearTimeout(typingTimer);
  panel.typing.hidden = true;
}

function stopFollowing() {
  if (source) source.close();
  source = null;
}

/** Reads where the hand-off stands and what the page missed, then follows the stream. */
async function resync() {
  let data;
  try {
    const response = await fetch(`${panel.root.dataset.stateUrl}?after=${lastMessageId()}`, {
      headers: { Accept: "application/json" },
      credentials: "same-origin",
    });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    data = await response.json();
  } catch {
    const delay = RESYNC_DELAYS_MS[Math.min(resyncs, RESYNC_DELAYS_MS.length - 1)];
    resyncs += 1;
    setTimeout(resync, delay);
    return;
  }
  resyncs = 0;
  data.messages.forEach(showMessage);
  setState(data.state, data.agent);
  panel.rating.hidden = !data.rate_handoff;
  if (state === "waiting" || state === "agent") follow(data.events_after);
  else stopFollowing();
}

function follow(after) {
  stopFollowing();
  const es = new EventSource(`${panel.root.dataset.eventsUrl}?after=${encodeURIComponent(after)}`);
  source = es;
  let broken = false;
  const on = (type, handler) =>
    es.addEventListener(type, (event) => {
      if (source !== es) return;
      handler(parseJson(event.data) || {});
    });
  on("waiting", showWaiting);
  on("agent_joined", (data) => {
    setState("agent", data.agent);
  });
  on("message", showMessage);
  on("typing", (data) => {
    if (data.who === "agent") showTyping(data.author);
  });
  on("handed_back", (data) => {
    stopFollowing();
    setState("assistant");
    setStatus(data.by === "agent" ? "You are back with the assistant." : "");
  });
  on("resolved", (data) => {
    setState("resolved", data.agent);
  });
  on("rating_request", () => {
    stopFollowing();
    panel.rating.hidden = false;
  });
  es.addEventListener("open", () => {
    // Back after a lost connection: what was sent meanwhile is read from the database.
    if (source === es && broken) {
      broken = false;
      resync();
    }
  });
  es.addEventListener("error", (event) => {
    if (source !== es) return;
    if (event instanceof MessageEvent || es.readyState === EventSource.CLOSED) {
      stopFollowing();
      setTimeout(resync, RESYNC_DELAYS_MS[0]);
    } else {
      broken = true; // the browser reconnects with Last-Event-ID
    }
  });
}

async function requestPerson(trigger) {
  const body = new FormData();
  body.set("trigger", trigger);
  let result;
  try {
    result = await post(panel.root.dataset.requestUrl, body);
  } catch {
    showBanner("Could not reach the server. Check your connection and try again.");
    return;
  }
  const { response, payload } = result;
  if (response.status !== 201) {
    showBanner((payload.error && payload.error.message) || `Something went wrong (HTTP ${response.status}).`);
    return;
  }
  setState("waiting");
  if (payload.agents_online === 0) showWaiting({ agents_online: 0 });
  resync();
}

async function withdraw(event) {
  event.preventDefault();
  const { response, payload } = await post(panel.root.dataset.withdrawUrl);
  if (!response.ok) {
    showBanner((payload.error && payload.error.message) || "Could not go back to the assistant.");
    resync();
    return;
  }
  stopFollowing();
  setState("assistant");
}

async function rate(event) {
  event.preventDefault();
  const form = panel.rating;
  const { response, payload } = await post(panel.root.dataset.ratingUrl, new FormData(form));
  if (response.status === 201 || response.status === 409) {
    form.hidden = true;
    setStatus(response.status === 201 ? "Thank you for your rating." : payload.error.message);
    return;
  }
  showBanner((payload.error && payload.error.message) || "Could not send your rating.");
}

/** While a person is in the conversation, they see that the customer is typing. */
function onComposerInput() {
  if (state !== "agent" && state !== "waiting") return;
  const now = Date.now();
  if (now - lastTypingSent < TYPING_SEND_EVERY_MS) return;
  lastTypingSent = now;
  post(panel.root.dataset.typingUrl).catch(() => {});
}

/** A message the stream showed before the composer's own response arrived is shown once. */
function dropRepeatedMessages() {
  const seen = new Set();
  document.querySelectorAll("#messages [data-message-id]").forEach((bubble) => {
    if (seen.has(bubble.dataset.messageId)) bubble.remove();
    else seen.add(bubble.dataset.messageId);
  });
}

/** A second thumbs-down in the conversation offers a person. */
function onFeedbackSwap() {
  if (state !== "assistant") return;
  const downs = document.querySelectorAll('#messages .feedback__button[value="down"][aria-pressed="true"]');
  if (downs.length >= 2) panel.offer.hidden = false;
}

/** Under an answer that declined (the help center had nothing), a person is offered. */
function onAnswerDone(event) {
  const data = event.detail || {};
  // `declined` is the reason ("nothing_found", ...), empty when the answer quoted the help center.
  const declined = Boolean(data.grounding && data.grounding.declined);
  const offer = event.target.querySelector(".bubble__offer");
  if (offer && declined && state === "assistant") offer.hidden = false;
}

/** A message sent while a person has the conversation, or one that asked for a person. */
function onHeldMessage(event) {
  const detail = event.detail || {};
  if (detail.state) setState(detail.state);
  if (detail.agents_online === 0) showWaiting({ agents_online: 0 });
  if (!source) resync();
}

export function attachHandoff() {
  panel.root = document.getElementById("handoff");
  if (!panel.root) return;
  panel.status = document.getElementById("handoff-status");
  panel.typing = document.getElementById("handoff-typing");
  panel.offer = document.getElementById("handoff-offer");
  panel.rating = document.getElementById("handoff-rating");
  panel.request = document.getElementById("handoff-request");
  panel.withdraw = document.getElementById("handoff-withdraw");
  agentName = panel.root.dataset.agent || "";
  state = panel.root.dataset.state;

  panel.request.addEventListener("submit", (event) => {
    event.preventDefault();
    requestPerson("button");
  });
  document.addEventListener("click", (event) => {
    const offer = event.target.closest(".offer-person");
    if (offer) requestPerson(offer.dataset.trigger);
  });
  panel.withdraw.addEventListener("submit", withdraw);
  panel.rating.addEventListener("submit", rate);
  const input = document.getElementById("message-input");
  if (input) input.addEventListener("input", onComposerInput);
  document.body.addEventListener("htmx:afterSwap", onFeedbackSwap);
  document.body.addEventListener("htmx:afterSwap", dropRepeatedMessages);
  document.body.addEventListener("handoff", onHeldMessage);
  document.getElementById("messages").addEventListener("answer-done", onAnswerDone);

  if (state === "waiting" || state === "agent") {
    setState(state);
    follow(panel.root.dataset.eventsAfter);
  }
}
