// cronwell dashboard: theme toggle, the zone instants are shown in, and the live refresh's
// interval, each remembered in localStorage. Loaded as a file: the CSP allows no inline
// script (and htmx's own trigger filters would need eval).
"use strict";
(function () {
  var root = document.documentElement;
  var saved = localStorage.getItem("cronwell-theme");
  if (saved === "light" || saved === "dark") root.dataset.theme = saved;
  var ZONES = ["local", "utc", "job"];
  var REFRESH_KEY = "cronwell-refresh";

  document.addEventListener("DOMContentLoaded", function () {
    var toggle = document.getElementById("theme-toggle");
    if (toggle) toggle.addEventListener("click", function () {
      var dark = root.dataset.theme
        ? root.dataset.theme === "dark"
        : window.matchMedia("(prefers-color-scheme: dark)").matches;
      root.dataset.theme = dark ? "light" : "dark";
      localStorage.setItem("cronwell-theme", root.dataset.theme);
    });
    zoneSwitch();
    localTimes(document);
    document.querySelectorAll("[data-poll]").forEach(poll);
    document.body.addEventListener("htmx:afterSwap", function (e) { localTimes(e.target); });
  });

  // The zone switch: the viewer's zone, UTC, or each instant's job zone (offered only on
  // pages whose instants carry one).
  function zoneSwitch() {
    var select = document.getElementById("zone-switch");
    if (!select) return;
    if (!document.querySelector("time[data-zone]")) {
      var job = select.querySelector("option[value=job]");
      if (job) job.remove();
    }
    select.value = zone();
    select.addEventListener("change", function () {
      localStorage.setItem("cronwell-zone", select.value);
      localTimes(document);
    });
  }

  function zone() {
    var z = localStorage.getItem("cronwell-zone");
    if (ZONES.indexOf(z) < 0) return "local";
    if (z === "job" && !document.querySelector("time[data-zone]")) return "local";
    return z;
  }

  function localTimes(scope) {
    var mode = zone();
    root.dataset.zone = mode;
    scope.querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) return;
      var opts = { timeZoneName: "short" };
      if (mode === "utc") opts.timeZone = "UTC";
      else if (mode === "job" && el.dataset.zone) opts.timeZone = el.dataset.zone;
      try {
        el.textContent = d.toLocaleString(undefined, opts);
      } catch (e) {  // a zone this browser does not know: the viewer's
        el.textContent = d.toLocaleString(undefined, { timeZoneName: "short" });
      }
    });
  }

  // An element with data-poll (milliseconds) is refreshed by htmx's "poll" event at that
  // interval while the tab is visible; a select[data-for=its id] changes the interval (0:
  // off), remembered for every page.
  function poll(el) {
    var timer = null;
    var control = document.querySelector("select[data-for='" + el.id + "']");
    function start(ms) {
      if (timer) clearInterval(timer);
      timer = null;
      el.dataset.poll = String(ms);
      if (ms > 0) timer = setInterval(tick, ms);
    }
    function tick() {
      if (!document.hidden && window.htmx) window.htmx.trigger(el, "poll");
    }
    var stored = localStorage.getItem(REFRESH_KEY);
    var ms = parseInt(el.dataset.poll, 10) || 5000;
    if (control) {
      if (stored !== null && control.querySelector("option[value='" + stored + "']")) {
        control.value = stored;
      }
      ms = parseInt(control.value, 10) * 1000;
      control.addEventListener("change", function () {
        localStorage.setItem(REFRESH_KEY, control.value);
        start(parseInt(control.value, 10) * 1000);
      });
    }
    start(ms);
    // Back on a hidden tab: refresh at once rather than at the next tick.
    document.addEventListener("visibilitychange", function () {
      if (!document.hidden && timer) tick();
    });
  }
})();
