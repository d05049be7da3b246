// The overview's charts: on open, the last hour per minute and the last
// days (GET /api/history); then every second the counters and the live
// chart (GET /api/overview), processed/s and failed/s appended to the
// last hour. Drawn with uPlot (vendored, see vendor/uplot/VERSION).
// Served from 'self' only (the Content-Security-Policy allows no inline
// script). Each chart says how many points it draws in data-points.
(function () {
  "use strict";
  var chartEl = document.getElementById("chart");
  var historyEl = document.getElementById("history");
  var HOUR = 3600;
  var times = [], processed = [], failed = [];
  var last = null;
  var plot = null;

  function makePlot(el, data, labels, height) {
    if (typeof uPlot === "undefined" || !el) return null;
    var width = Math.max(300, el.clientWidth || 900);
    return new uPlot({
      width: width,
      height: height,
      scales: { x: { time: true } },
      series: [
        {},
        { label: labels[0], stroke: "#2a7", width: 2 },
        { label: labels[1], stroke: "#c33", width: 2 }
      ],
      axes: [{}, { size: 60 }]
    }, data, el);
  }

  function draw() {
    if (!plot) plot = makePlot(chartEl, [times, processed, failed], ["processed/s", "failed/s"], 220);
    if (plot) plot.setData([times, processed, failed]);
    chartEl.setAttribute("data-points", String(times.length));
  }

  function set(id, value) {
    var el = document.getElementById(id);
    if (el && value !== undefined && value !== null) el.textContent = String(value);
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); });
  }

  // The minutes before this one, as rates at each minute's middle; the
  // days, as totals at each day's start.
  function loadHistory() {
    var url = chartEl.getAttribute("data-history");
    if (!url) return Promise.resolve();
    return getJSON(url).then(function (h) {
      (h.minutes || []).slice(0, -1).forEach(function (m) {
        times.push(m.t + 30);
        processed.push(m.processed / 60);
        failed.push(m.failed / 60);
      });
      draw();
      if (historyEl) {
        var days = h.days || [];
        var data = [
          days.map(function (d) { return Date.parse(d.date + "T00:00:00Z") / 1000; }),
          days.map(function (d) { return d.processed; }),
          days.map(function (d) { return d.failed; })
        ];
        makePlot(historyEl, data, ["processed/day", "failed/day"], 180);
        historyEl.setAttribute("data-points", String(days.length));
      }
    }).catch(function () { chartEl.classList.add("stale"); });
  }

  function tick() {
    getJSON(chartEl.getAttribute("data-api") || "/api/overview")
      .then(function (s) {
        ["processed", "failed", "busy", "capacity", "enqueued", "scheduled", "retries", "dead"].forEach(function (k) { set(k, s[k]); });
        if (last && s.time > last.time) {
          var dt = s.time - last.time;
          times.push(s.time);
          processed.push(Math.max(0, (s.processed - last.processed) / dt));
          failed.push(Math.max(0, (s.failed - last.failed) / dt));
          while (times.length && times[0] < s.time - HOUR) { times.shift(); processed.shift(); failed.shift(); }
          draw();
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
  if (chartEl) loadHistory().then(tick);
})();
