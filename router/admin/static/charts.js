/* polyspec admin charts: a few SVG charts in plain JavaScript (no library, no network).
 * Every bar carries data-category / data-series / data-value so tests can read what was drawn. */
(function (global) {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var PALETTE = ["#3461d1", "#e07b39", "#2a9d8f", "#c0467b", "#7b61c9", "#8a9a2b", "#d1a034", "#4a90a4"];

  function el(tag, attrs, parent) {
    var node = document.createElementNS(NS, tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (parent) parent.appendChild(node);
    return node;
  }
  function text(parent, x, y, str, attrs) {
    var t = el("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    t.textContent = str;
    return t;
  }
  function svgRoot(container, width, height) {
    container.innerHTML = "";
    return el("svg", { viewBox: "0 0 " + width + " " + height, role: "img",
                       preserveAspectRatio: "xMidYMid meet" }, container);
  }
  function empty(container, message) {
    container.innerHTML = "";
    var div = document.createElement("div");
    div.className = "empty";
    div.textContent = message || "no data yet";
    container.appendChild(div);
  }
  function niceMax(v) {
    if (!(v > 0)) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * p >= v) return steps[i] * p;
    return 10 * p;
  }
  function yAxis(svg, box, yMax, fmt, ticks) {
    var g = el("g", { "class": "axis" }, svg);
    for (var i = 0; i <= ticks; i++) {
      var v = yMax * i / ticks, y = box.y + box.h - box.h * i / ticks;
      el("line", { x1: box.x, x2: box.x + box.w, y1: y, y2: y }, g);
      text(g, box.x - 6, y + 4, fmt(v), { "text-anchor": "end" });
    }
  }
  function legend(svg, x, y, series) {
    var g = el("g", { "class": "legend" }, svg), cx = x;
    series.forEach(function (s, i) {
      el("rect", { x: cx, y: y - 9, width: 11, height: 11, rx: 2, fill: s.color || PALETTE[i % PALETTE.length] }, g);
      var t = text(g, cx + 16, y, s.name);
      cx += 28 + 7.2 * String(s.name).length;
    });
  }

  /* Grouped vertical bars. opts: {categories, series: [{name, values, color}], yMax, format, yLabel} */
  function bars(container, opts) {
    var cats = opts.categories || [], series = opts.series || [];
    if (!cats.length || !series.length) return empty(container, opts.emptyText);
    var W = opts.width || 720, H = opts.height || 260;
    var box = { x: 46, y: 30, w: W - 60, h: H - 62 };
    var fmt = opts.format || function (v) { return v.toFixed(2); };
    var maxVal = 0;
    series.forEach(function (s) { s.values.forEach(function (v) { if (v != null && v > maxVal) maxVal = v; }); });
    var yMax = opts.yMax || niceMax(maxVal * 1.1);
    var svg = svgRoot(container, W, H);
    yAxis(svg, box, yMax, opts.tickFormat || fmt, 4);
    var groupW = box.w / cats.length, pad = Math.min(18, groupW * 0.18);
    var barW = Math.max(4, (groupW - 2 * pad) / series.length);
    var g = el("g", { "class": "bars" }, svg);
    cats.forEach(function (cat, ci) {
      series.forEach(function (s, si) {
        var v = s.values[ci];
        if (v == null) return;
        var h = box.h * Math.min(v, yMax) / yMax;
        var x = box.x + ci * groupW + pad + si * barW, y = box.y + box.h - h;
        var r = el("rect", { x: x + 1, y: y, width: barW - 2, height: Math.max(h, 0.5), rx: 2,
          fill: s.color || PALETTE[si % PALETTE.length], "data-category": cat, "data-series": s.name,
          "data-value": String(v) }, g);
        el("title", {}, r).textContent = cat + " · " + s.name + ": " + fmt(v);
        if (barW >= 18) text(g, x + barW / 2, y - 4, fmt(v), { "class": "value-label", "text-anchor": "middle" });
      });
      text(svg, box.x + ci * groupW + groupW / 2, box.y + box.h + 16, cat,
           { "text-anchor": "middle", "class": "category-label" });
    });
    legend(svg, box.x, 14, series);
    return svg;
  }

  /* Horizontal bars with a label and a formatted value per row. opts: {labels, values, format, colors} */
  function hbars(container, opts) {
    var labels = opts.labels || [], values = opts.values || [];
    if (!labels.length) return empty(container, opts.emptyText);
    var rowH = 30, W = opts.width || 360, H = rowH * labels.length + 16;
    var fmt = opts.format || function (v) { return String(v); };
    var max = opts.max || Math.max.apply(null, values.concat([1e-9]));
    var svg = svgRoot(container, W, H), labelW = 54, valueW = 70, barSpace = W - labelW - valueW;
    var g = el("g", { "class": "bars" }, svg);
    labels.forEach(function (label, i) {
      var y = 8 + i * rowH, w = barSpace * values[i] / max;
      text(svg, labelW - 8, y + 18, label, { "text-anchor": "end", "class": "category-label" });
      el("rect", { x: labelW, y: y + 5, width: barSpace, height: 18, rx: 3, fill: "#eef1f6" }, g);
      var r = el("rect", { x: labelW, y: y + 5, width: Math.max(w, 1), height: 18, rx: 3,
        fill: (opts.colors && opts.colors[i]) || PALETTE[i % PALETTE.length],
        "data-category": label, "data-value": String(values[i]) }, g);
      el("title", {}, r).textContent = label + ": " + fmt(values[i]);
      text(svg, labelW + barSpace + 8, y + 18, fmt(values[i]), { "class": "value-label" });
    });
    return svg;
  }

  /* Histogram: bins are [edge0, edge1, ...], counts has one fewer entry. */
  function histogram(container, opts) {
    var edges = opts.edges || [], counts = opts.counts || [];
    var total = counts.reduce(function (a, b) { return a + b; }, 0);
    if (!total) return empty(container, opts.emptyText);
    var W = opts.width || 360, H = opts.height || 220, box = { x: 34, y: 14, w: W - 44, h: H - 44 };
    var yMax = niceMax(Math.max.apply(null, counts) * 1.15);
    var svg = svgRoot(container, W, H);
    yAxis(svg, box, yMax, function (v) { return String(Math.round(v)); }, 4);
    var e0 = edges[0], span = edges[edges.length - 1] - e0, g = el("g", { "class": "bars" }, svg);
    function xAt(v) { return box.x + box.w * (v - e0) / span; }
    counts.forEach(function (c, i) {
      var h = box.h * c / yMax, x = xAt(edges[i]), bw = xAt(edges[i + 1]) - x, y = box.y + box.h - h;
      var below = opts.threshold != null && edges[i + 1] <= opts.threshold + 1e-9;
      var r = el("rect", { x: x + 1, y: y, width: Math.max(bw - 2, 1), height: Math.max(h, c ? 1 : 0), rx: 1.5,
        fill: below ? "#e0a35c" : "#3461d1", "data-category": edges[i].toFixed(2) + "-" + edges[i + 1].toFixed(2),
        "data-value": String(c) }, g);
      el("title", {}, r).textContent = edges[i].toFixed(2) + "–" + edges[i + 1].toFixed(2) + ": " + c;
      if (c) text(g, x + bw / 2, y - 3, String(c), { "class": "value-label", "text-anchor": "middle" });
    });
    [0, 0.25, 0.5, 0.75, 1].forEach(function (f) {
      var v = e0 + f * span;
      text(svg, xAt(v), box.y + box.h + 15, v.toFixed(2).replace(/0$/, ""), { "text-anchor": "middle", "class": "axis-label" });
    });
    if (opts.threshold != null) {
      var tx = xAt(opts.threshold);
      el("line", { x1: tx, x2: tx, y1: box.y, y2: box.y + box.h, stroke: "#d64545", "stroke-dasharray": "4 3" }, svg);
      text(svg, tx + 4, box.y + 10, "threshold " + opts.threshold, { fill: "#d64545", "class": "value-label" });
    }
    return svg;
  }

  global.PSCharts = { bars: bars, hbars: hbars, histogram: histogram, palette: PALETTE };
})(window);
