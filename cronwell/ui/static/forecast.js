// cronwell dashboard, forecast view: draws each pool's next hour with uPlot from the
// page's JSON block (#forecast-data; JSON is data, not script, so the CSP allows it). The
// time axis is in the viewer's zone (uPlot's default); colours follow the theme.
"use strict";
(function () {
  var charts = [];
  var data = null;

  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function draw() {
    charts.forEach(function (c) { c.destroy(); });
    charts = [];
    var fg = css("--fg"), muted = css("--muted"), line = css("--line");
    var stepped = uPlot.paths.stepped({ align: 1 });
    // counts and replicas are whole numbers: no 0.5 ticks
    var whole = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];
    function axis(extra) {
      var a = { stroke: muted, grid: { stroke: line, width: 1 }, ticks: { stroke: line, width: 1 } };
      for (var k in extra) a[k] = extra[k];
      return a;
    }
    data.pools.forEach(function (p, i) {
      var box = document.getElementById("chart-" + i);
      if (!box) return;
      var xs = p.due.map(function (_, j) { return data.start_epoch + j * data.resolution; });
      var opts = {
        width: Math.max(300, box.clientWidth),
        height: 260,
        scales: { x: { time: true }, r: { range: function (u, lo, hi) { return [0, Math.max(1, hi)]; } } },
        series: [
          { label: "time" },
          { label: "due / s", stroke: "#0969da", fill: "rgba(9, 105, 218, 0.18)", paths: stepped, points: { show: false } },
          { label: "concurrency", stroke: "#bf8700", paths: stepped, points: { show: false } },
          { label: "planned replicas", stroke: "#cf222e", width: 2, scale: "r", paths: stepped, points: { show: false } }
        ],
        axes: [
          axis({}),
          axis({ label: "occurrences", labelSize: 20, incrs: whole }),
          axis({ scale: "r", side: 1, label: "replicas", labelSize: 20, incrs: whole, grid: { show: false } })
        ]
      };
      box.style.color = fg;
      charts.push(new uPlot(opts, [xs, p.due, p.concurrency, p.replicas], box));
      // The chart says it: the per-minute table folds away (it stays one click off).
      var table = box.parentNode.querySelector("details.per-minute");
      if (table) table.removeAttribute("open");
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var el = document.getElementById("forecast-data");
    if (!el || !window.uPlot) return;
    data = JSON.parse(el.textContent);
    if (data.start_epoch === null) return;
    draw();
    window.addEventListener("resize", function () {
      charts.forEach(function (c, i) {
        var box = document.getElementById("chart-" + i);
        if (box) c.setSize({ width: Math.max(300, box.clientWidth), height: 260 });
      });
    });
    // The theme toggle changes data-theme: redraw in its colours.
    new MutationObserver(draw).observe(document.documentElement, { attributes: true, attributeFilter: ["data-theme"] });
  });
})();
