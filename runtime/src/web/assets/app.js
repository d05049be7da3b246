// The overview's live part: polls /api/overview every second, updates the
// counters and draws processed/failed per second over the last five
// minutes with uPlot (vendored, see vendor/uplot/VERSION). Served from
// 'self' only (the Content-Security-Policy allows no inline script).
(function () {
  "use strict";
  var chartEl = document.getElementById("chart");
  if (!chartEl) return;
  var api = chartEl.getAttribute("data-api") || "/api/overview";
  var keep = 300;
  var times = [], processed = [], failed = [];
  var last = null;
  var plot = null;

  function makePlot() {
    if (typeof uPlot === "undefined") return null;
    var width = Math.max(300, chartEl.clientWidth || 900);
    return new uPlot({
      width: width,
      height: 220,
      scales: { x: { time: true } },
      series: [
        {},
        { label: "processed/s", stroke: "#2a7", width: 2 },
        { label: "failed/s", stroke: "#c33", width: 2 }
      ],
      axes: [{}, { size: 60 }]
    }, [times, processed, failed], chartEl);
  }

  function set(id, value) {
    var el = document.getElementById(id);
    if (el && value !== undefined && value !== null) el.textContent = String(value);
  }

  function tick() {
    fetch(api, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (s) {
        ["processed", "failed", "busy", "capacity", "enqueued", "scheduled", "retries", "dead"].forEach(function (k) { set(k, s[k]); });
        if (last && s.time > last.time) {
          var dt = s.time - last.time;
          times.push(s.time);
          processed.push(Math.max(0, (s.processed - last.processed) / dt));
          failed.push(Math.max(0, (s.failed - last.failed) / dt));
          if (times.length > keep) { times.shift(); processed.shift(); failed.shift(); }
          if (!plot) plot = makePlot();
          if (plot) plot.setData([times, processed, failed]);
        }
        last = s;
        chartEl.classList.remove("stale");
      })
      .catch(function () { chartEl.classList.add("stale"); })
      .then(function () { setTimeout(tick, 1000); });
  }

  // Ask before the destructive buttons (forms marked "confirm").
  document.querySelectorAll("form.confirm").forEach(function (f) {
    f.addEventListener("submit", function (e) { if (!window.confirm("Sure?")) e.preventDefault(); });
  });
  tick();
})();
