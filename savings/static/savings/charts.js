/* Draws every <canvas data-chart="ID"> from the Chart.js config in <script id="ID" type="application/json">.
   Configs are plain JSON (made on the server); the few functions JSON cannot carry are added here:
   a linear x axis marked `utcTime` holds Unix milliseconds and shows them as UTC clock times
   ("time": 14:05; "date": 03-14 14:05, for windows of several days). */
(function () {
  "use strict";
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function utcLabel(ms, withDate) {
    var d = new Date(ms);
    var hm = pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes());
    return withDate ? d.toISOString().slice(0, 10) + " " + hm + " UTC" : hm;
  }
  function utcTick(ms, format) {
    return format === "date" ? new Date(ms).toISOString().slice(5, 10) + " " + utcLabel(ms, false) : utcLabel(ms, false);
  }
  function draw(canvas) {
    var source = document.getElementById(canvas.dataset.chart);
    if (!source || typeof Chart === "undefined" || Chart.getChart(canvas)) { return; }
    var config = JSON.parse(source.textContent);
    var x = config.options && config.options.scales && config.options.scales.x;
    if (x && x.utcTime) {
      var format = x.utcTime;
      delete x.utcTime;
      x.ticks = Object.assign({}, x.ticks, { callback: function (v) { return utcTick(v, format); } });
      config.options.plugins = config.options.plugins || {};
      config.options.plugins.tooltip = {
        callbacks: { title: function (items) { return items.length ? utcLabel(items[0].parsed.x, true) : ""; } }
      };
    }
    new Chart(canvas, config);
  }
  function drawAll() { document.querySelectorAll("canvas[data-chart]").forEach(draw); }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", drawAll); } else { drawAll(); }
})();
