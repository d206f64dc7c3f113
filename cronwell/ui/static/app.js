// cronwell dashboard: theme toggle (kept in localStorage) and instants shown in the
// viewer's time zone. Loaded as a file: the CSP allows no inline script.
"use strict";
(function () {
  var root = document.documentElement;
  var saved = localStorage.getItem("cronwell-theme");
  if (saved === "light" || saved === "dark") root.dataset.theme = saved;
  document.addEventListener("DOMContentLoaded", function () {
    var toggle = document.getElementById("theme-toggle");
    if (toggle) toggle.addEventListener("click", function () {
      var dark = root.dataset.theme
        ? root.dataset.theme === "dark"
        : window.matchMedia("(prefers-color-scheme: dark)").matches;
      root.dataset.theme = dark ? "light" : "dark";
      localStorage.setItem("cronwell-theme", root.dataset.theme);
    });
    localTimes(document);
    // Elements with data-poll refresh (htmx "poll" trigger) while the tab is visible; the
    // trigger is fired from here because htmx's own filter expressions need eval (CSP).
    document.querySelectorAll("[data-poll]").forEach(function (el) {
      var every = parseInt(el.dataset.poll, 10) || 5000;
      setInterval(function () {
        if (!document.hidden && window.htmx) window.htmx.trigger(el, "poll");
      }, every);
    });
    document.body.addEventListener("htmx:afterSwap", function (e) { localTimes(e.target); });
  });
  function localTimes(scope) {
    scope.querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (!isNaN(d)) el.textContent = d.toLocaleString();
    });
  }
})();
