// Pulse dashboard: live updates over server-sent events, copy buttons. No inline script:
// the page's Content-Security-Policy allows only files served by Pulse.
(function () {
  "use strict";
  function live() {
    var url = document.body.getAttribute("data-live");
    if (!url || !window.EventSource) return;
    var source = new EventSource(url);
    ["heartbeats", "events", "chat", "deliveries"].forEach(function (kind) {
      source.addEventListener(kind, function () {
        if (window.htmx) window.htmx.trigger(document.body, "live-" + kind);
      });
    });
  }
  function copy(event) {
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var text = button.getAttribute("data-copy");
    if (navigator.clipboard) {
      navigator.clipboard.writeText(text).then(function () {
        button.textContent = "copied";
      });
    }
  }
  function confirmSubmit(event) {
    var form = event.target.closest("form[data-confirm]");
    if (form && !window.confirm(form.getAttribute("data-confirm"))) event.preventDefault();
  }
  // The chat opens at its newest message with the message box in view, and follows new
  // messages as they come unless the person has scrolled up to read.
  function atBottom() {
    var page = document.documentElement;
    return window.innerHeight + window.scrollY >= page.scrollHeight - 48;
  }
  function toBottom() {
    window.scrollTo(0, document.documentElement.scrollHeight);
  }
  var following = true;
  function chatOpened() {
    if (document.querySelector(".chat")) toBottom();
  }
  document.addEventListener("htmx:beforeSwap", function () {
    if (document.querySelector(".chat")) following = atBottom();
  });
  document.addEventListener("htmx:afterSettle", function () {
    if (document.querySelector(".chat") && following) toBottom();
  });
  document.addEventListener("DOMContentLoaded", chatOpened);
  document.addEventListener("DOMContentLoaded", live);
  document.addEventListener("click", copy);
  document.addEventListener("submit", confirmSubmit, true);
})();
