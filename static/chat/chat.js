/*
 * The chat page's entry module: wires the composer, renders stored answers and streams the
 * pending ones, including those that arrive later through htmx swaps.
 * No framework and no build step: plain ES modules, one per concern (composer.js, stream.js,
 * rendering.js, handoff.js), and the vendored markdown-it.
 */
import { attachComposer, pendingAnswerExists, refreshComposer, watchStopButton } from "./composer.js";
import { attachHandoff } from "./handoff.js";
import { AnswerView, renderMarkdown, scrollToBottom } from "./rendering.js";
import { followAnswer } from "./stream.js";

const known = new WeakSet();

function setupBubble(bubble) {
  if (known.has(bubble)) return;
  known.add(bubble);
  if (bubble.dataset.status === "pending") {
    watchStopButton(bubble);
    followAnswer(bubble, { onFinish: refreshComposer });
  } else {
    const view = new AnswerView(bubble);
    view.render(view.storedText());
  }
}

function setupBubbles() {
  document.querySelectorAll("#messages .bubble--assistant").forEach(setupBubble);
  refreshComposer();
}

function init() {
  if (!attachComposer()) return;
  // New bubbles arrive through htmx swaps; setupBubble skips the ones it already knows.
  document.body.addEventListener("htmx:afterSwap", setupBubbles);
  // A page restored from the back/forward cache has lost its streams: load it afresh.
  window.addEventListener("pageshow", (event) => {
    if (event.persisted && pendingAnswerExists()) window.location.reload();
  });
  setupBubbles();
  attachHandoff();
  scrollToBottom();
}

// A hook for browser tests of the renderer; the page itself does not need it.
window.SupportChat = { renderMarkdown };

// A module runs once the document is parsed, so the page's elements are there.
init();
