// pgscribe console: live updates. Every data-refresh milliseconds it
// fetches the page again and swaps the element with id "live" for the new
// one. The HTML comes from this console's templates (escaped on the
// server); DOMParser runs no script. Without this file the page is the
// same, only static.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) return;
  var every = parseInt(live.getAttribute("data-refresh"), 10);
  if (!(every > 0)) return;
  document.body.classList.add("live");
  function tick() {
    if (document.hidden) { setTimeout(tick, every); return; }
    fetch(location.href, { headers: { "X-Console-Live": "1" }, cache: "no-store", credentials: "same-origin" })
      .then(function (r) { if (!r.ok && r.status !== 404) throw new Error(r.status); return r.text(); })
      .then(function (text) {
        var next = new DOMParser().parseFromString(text, "text/html").getElementById("live");
        if (next) live.replaceChildren.apply(live, Array.prototype.slice.call(next.childNodes).map(function (n) { return document.adoptNode(n); }));
        document.body.classList.remove("stale");
      })
      .catch(function () { document.body.classList.add("stale"); })
      .then(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
