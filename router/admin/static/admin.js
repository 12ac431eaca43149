/* polyspec admin dashboard: polls /admin/api/summary and redraws. Same-origin only, no external requests. */
(function () {
  "use strict";
  var root = document.getElementById("dashboard");
  var api = root.dataset.api, refreshUrl = root.dataset.refreshUrl;
  var interval = parseInt(root.dataset.intervalMs, 10) || 5000;
  var statusEl = document.getElementById("status");
  // The outcome of the last refresh click stays on the status line for a while: the reload that follows a
  // refresh (or a periodic one) must not wipe it out at once, before anyone (or a browser test) could read it.
  var NOTE_MS = 10000;
  var refreshNote = { text: "", until: 0 };
  var POS_COLORS = ["#1f4fb8", "#4f7fe0", "#8fb0f0", "#bccff5", "#dbe5fa", "#eef3fd"];

  function fmt2(v) { return v == null ? "–" : Number(v).toFixed(2); }
  function pct(v) { return v == null ? "–" : (100 * v).toFixed(1) + "%"; }
  function esc(s) {
    return String(s == null ? "" : s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function table(container, headers, rows, emptyText) {
    if (!rows.length) { container.innerHTML = '<div class="empty">' + esc(emptyText || "nothing yet") + "</div>"; return; }
    var html = "<table><thead><tr>" + headers.map(function (h) {
      return '<th class="' + (h.num ? "num" : "") + '">' + esc(h.label) + "</th>";
    }).join("") + "</tr></thead><tbody>";
    rows.forEach(function (r) { html += "<tr" + (r.attrs || "") + ">" + r.cells.join("") + "</tr>"; });
    container.innerHTML = html + "</tbody></table>";
  }
  function td(v, cls, key) {
    return '<td class="' + (cls || "") + '"' + (key ? ' data-key="' + key + '"' : "") + ">" + v + "</td>";
  }

  function renderKpis(s) {
    var t = s.totals, items = [
      ["requests", "Requests", String(t.requests)],
      ["languages", "Languages seen", String(t.languages)],
      ["mal", "Mean acceptance length", fmt2(t.mean_acceptance_length)],
      ["tokens", "Completion tokens", String(t.completion_tokens)],
      ["backends", "Healthy backends", t.healthy_backends + " / " + t.backends]
    ];
    document.getElementById("kpis").innerHTML = items.map(function (it) {
      return '<div class="kpi" data-kpi="' + it[0] + '"><div class="label">' + it[1] +
             '</div><div class="value">' + esc(it[2]) + "</div></div>";
    }).join("");
  }

  function renderCharts(s) {
    var langs = s.languages.filter(function (l) { return l.acceptance; });
    var series = [];
    for (var i = 0; i < s.k; i++) {
      series.push({ name: "pos " + (i + 1), color: POS_COLORS[i % POS_COLORS.length],
        values: langs.map(function (l) { return l.acceptance[i] == null ? null : l.acceptance[i]; }) });
    }
    PSCharts.bars(document.getElementById("chart-acceptance"), {
      categories: langs.map(function (l) { return l.code; }), series: series, yMax: 1, height: 240,
      format: function (v) { return (100 * v).toFixed(0) + "%"; },
      width: 720, tickFormat: function (v) { return Math.round(v * 100) + "%"; },
      emptyText: "no speculative decoding recorded yet"
    });
    var mal = s.languages.filter(function (l) { return l.mean_acceptance_length != null || l.offline_mean_acceptance_length != null; });
    PSCharts.bars(document.getElementById("chart-mal"), {
      categories: mal.map(function (l) { return l.code; }), height: 240, width: 360,
      series: [
        { name: "live", color: "#3461d1", values: mal.map(function (l) { return l.mean_acceptance_length; }) },
        { name: "offline", color: "#a9b4c8", values: mal.map(function (l) { return l.offline_mean_acceptance_length; }) }
      ],
      yMax: Math.max(1, s.k + 1 > 4 ? s.k + 1 : 4), tickFormat: function (v) { return v.toFixed(1); },
      emptyText: "no acceptance figures yet"
    });
    var traffic = s.languages.filter(function (l) { return l.requests > 0; });
    PSCharts.hbars(document.getElementById("chart-traffic"), {
      labels: traffic.map(function (l) { return l.code; }), max: 1,
      values: traffic.map(function (l) { return l.share; }),
      format: function (v) { return pct(v); }, emptyText: "no requests yet"
    });
    PSCharts.histogram(document.getElementById("chart-langid"), {
      edges: s.langid.edges, counts: s.langid.counts, threshold: s.langid.threshold,
      emptyText: "no language-ID decisions yet"
    });
  }

  function renderTables(s) {
    table(document.getElementById("table-backends"),
      [{ label: "backend" }, { label: "languages" }, { label: "draft" }],
      s.backends.map(function (b) {
        return { attrs: ' data-backend="' + esc(b.name) + '" data-healthy="' + (b.healthy ? "true" : "false") + '"',
          cells: [td('<span class="dot ' + (b.healthy ? "up" : "down") + '" title="' + (b.healthy ? "up" : "down") +
                     '"></span>' + esc(b.name) + (b.is_default ? ' <span class="muted">(default)</span>' : "") +
                     '<span class="sub" title="' + esc(b.detail || "") + '">' + esc(b.url || "") + "</span>", "", "name"),
                  td(esc((b.languages || []).join(", ")), "", "languages"), td(esc(b.draft || "none"), "", "draft")] };
      }), "no backends configured");
    table(document.getElementById("table-live"),
      [{ label: "language" }, { label: "draft" }, { label: "domain" }, { label: "requests", num: true },
       { label: "spec steps", num: true }].concat(
        Array.from({ length: s.k }, function (_, i) { return { label: "pos " + (i + 1), num: true }; })).concat(
       [{ label: "live MAL", num: true }, { label: "offline MAL", num: true }, { label: "Δ", num: true },
        { label: "predicted tok/s", num: true }, { label: "observed tok/s", num: true }]),
      s.live.map(function (r) {
        var delta = (r.mean_acceptance_length != null && r.offline_mean_acceptance_length != null)
          ? r.mean_acceptance_length - r.offline_mean_acceptance_length : null;
        var cells = [td(esc(r.language), "", "language"), td(esc(r.draft), "", "draft"), td(esc(r.domain)),
                     td(r.requests, "num", "requests"), td(r.num_spec_steps, "num")];
        for (var i = 0; i < s.k; i++) cells.push(td(r.acceptance ? pct(r.acceptance[i]) : "–", "num", "pos" + (i + 1)));
        cells.push(td(fmt2(r.mean_acceptance_length), "num", "live_mal"),
                   td(fmt2(r.offline_mean_acceptance_length), "num", "offline_mal"),
                   td(delta == null ? "–" : (delta >= 0 ? "+" : "") + delta.toFixed(2),
                      "num delta " + (delta == null ? "" : delta >= 0 ? "pos" : "neg"), "delta"),
                   td(r.predicted_tps == null ? "–" : r.predicted_tps.toFixed(1), "num", "predicted_tps"),
                   td(r.observed_tps == null ? "–" : r.observed_tps.toFixed(1), "num", "observed_tps"));
        return { attrs: ' data-language="' + esc(r.language) + '" data-draft="' + esc(r.draft) + '"', cells: cells };
      }), "no traffic recorded yet");
    var rows = [];
    s.drafts.forEach(function (lang) {
      var flag = lang.plan ? '<span class="flag ' + (lang.from_scratch ? "scratch" : "finetune") + '">' +
        (lang.from_scratch ? "from scratch · custom vocab" : esc(lang.plan)) + "</span>" : '<span class="muted">no profile</span>';
      var drafts = lang.drafts.length ? lang.drafts : [null];
      drafts.forEach(function (d, i) {
        rows.push({ attrs: ' data-language="' + esc(lang.language) + '" data-from-scratch="' + (lang.from_scratch ? "true" : "false") + '"',
          cells: [td(i ? "" : "<b>" + esc(lang.language) + "</b> " + '<span class="muted">' + esc(lang.name || "") + "</span>", "", "language"),
                  td(i ? "" : esc(lang.script || "–")), td(i ? "" : flag, "", "plan"),
                  td(d ? esc(d.name) + ' <span class="muted">v' + d.version + "</span>" : '<span class="muted">none</span>', "", "draft"),
                  td(d ? '<span class="status-' + esc(d.status) + '">' + esc(d.status) + "</span>" : "", "", "status"),
                  td(d ? esc(d.domain) : ""), td(d ? d.draft_vocab_size : "", "num"),
                  td(d ? fmt2(d.offline_mean_acceptance_length) : "", "num", "offline_mal"),
                  td(i ? "" : '<span class="muted">' + esc(lang.reason || "") + "</span>", "reason")] });
      });
    });
    table(document.getElementById("table-drafts"),
      [{ label: "language" }, { label: "script" }, { label: "plan" }, { label: "draft" }, { label: "status" },
       { label: "domain" }, { label: "draft vocab", num: true }, { label: "offline MAL", num: true }, { label: "reason" }],
      rows, "no drafts or language profiles in the registry");
    renderTimeline(s.adaptation || []);
  }

  // One row per `polyspec adapt` event, newest first, grouped by language (its steps in order of time).
  function renderTimeline(events) {
    var byLang = {};
    events.forEach(function (e) { (byLang[e.language] = byLang[e.language] || []).push(e); });
    var rows = [];
    Object.keys(byLang).sort().forEach(function (lang) {
      byLang[lang].forEach(function (e, i) {
        rows.push({ attrs: ' data-language="' + esc(lang) + '" data-step="' + esc(e.step) + '"',
          cells: [td(i ? "" : "<b>" + esc(lang) + "</b>", "", "language"),
                  td(e.at ? esc(new Date(e.at).toLocaleString()) : "–"), td(esc(e.step), "", "step"),
                  td('<span class="status-' + esc(e.status) + '">' + esc(e.status) + "</span>", "", "status"),
                  td('<span class="muted">' + esc(e.attempt || "") + "</span>"),
                  td(esc(e.summary), "", "figures")] });
      });
    });
    table(document.getElementById("table-adaptation"),
      [{ label: "language" }, { label: "when" }, { label: "step" }, { label: "status" }, { label: "attempt" },
       { label: "figures (before → after)" }], rows, "no adaptation yet (polyspec adapt)");
  }

  function render(s) {
    renderKpis(s); renderCharts(s); renderTables(s);
    document.getElementById("router-id").textContent = s.router_id;
    statusEl.textContent = "updated " + new Date().toLocaleTimeString() +
      (s.registry_error ? " · registry unavailable: " + s.registry_error : "") +
      (Date.now() < refreshNote.until ? " · " + refreshNote.text : "");
    root.dataset.loaded = String((parseInt(root.dataset.loaded || "0", 10) || 0) + 1);
  }

  function load() {
    return fetch(api, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(render)
      .catch(function (e) { statusEl.textContent = "update failed: " + e.message; });
  }

  document.getElementById("refresh-table").addEventListener("click", function (ev) {
    var btn = ev.currentTarget;
    btn.disabled = true;
    // State-changing admin calls take a JSON body and the page's CSRF token (the server's double-submit check).
    fetch(refreshUrl, { method: "POST", credentials: "same-origin", body: "{}",
                        headers: { "Content-Type": "application/json", "X-CSRF-Token": root.dataset.csrf || "" } })
      .then(function (r) { return r.json().then(function (body) { return { ok: r.ok, body: body }; }); })
      .then(function (res) {
        var err = res.body.error ? res.body.error.message : res.body.detail;
        refreshNote = { text: res.ok ? "routing table refreshed (" + res.body.backends + " backends)"
                                     : "refresh failed: " + (err || "error"), until: Date.now() + NOTE_MS };
        statusEl.textContent = refreshNote.text;
        return load();
      })
      .catch(function (e) {
        refreshNote = { text: "refresh failed: " + e.message, until: Date.now() + NOTE_MS };
        statusEl.textContent = refreshNote.text;
      })
      .then(function () { btn.disabled = false; });
  });

  load();
  setInterval(load, interval);
})();
