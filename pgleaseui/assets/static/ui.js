// pgleaseui: refreshes the page's data every 1.5 s without a reload, by
// fetching the same page's fleet part and swapping it in, and asks for
// confirmation before a button's POST.
(function () {
  "use strict";
  var fleet = document.getElementById("fleet");
  var badge = document.getElementById("refresh");
  var busy = false;
  var refreshes = 0;
  function refresh() {
    if (busy || !fleet) return;
    busy = true;
    fetch("./?part=fleet", { cache: "no-store", credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        var open = {};
        fleet.querySelectorAll("article.job details[open]").forEach(function (d) {
          open[d.parentNode.getAttribute("data-job")] = true;
        });
        fleet.innerHTML = html;
        fleet.querySelectorAll("article.job").forEach(function (a) {
          if (open[a.getAttribute("data-job")]) a.querySelector("details").open = true;
        });
        fleet.dataset.refreshes = String(++refreshes);
        badge.textContent = "ok";
        badge.className = "refresh";
      })
      .catch(function (e) {
        badge.textContent = "stale (" + e.message + ")";
        badge.className = "refresh stale";
      })
      .finally(function () { busy = false; });
  }
  setInterval(refresh, 1500);
  document.addEventListener("submit", function (e) {
    var msg = e.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) e.preventDefault();
  });
})();
