"""The report's one script: it opens row views. A click on anything carrying ``data-row`` (a cell
of the row strip or of a map, a finding, a difference) draws that row's decoded values (a chart
and a table) and its annotated bytes from the JSON the cache's section embeds.

Every string from the data goes into the page through ``textContent`` or SVG attributes set one
by one, never as markup, so a name holding ``<script>`` stays text. The script initialises every
``.kvf`` root on the page that is not yet initialised, so a notebook's outputs each work.
"""

JS = r"""
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";

  function el(name, cls, text) {
    var node = document.createElement(name);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function svgEl(name, attrs) {
    var node = document.createElementNS(SVG, name);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, String(attrs[k])); });
    return node;
  }

  function floats(b64) {
    var raw = atob(b64), bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    return new Float32Array(bytes.buffer);
  }

  function fmt(v) {
    if (Number.isNaN(v)) return "nan";
    if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
    return String(Number(v.toPrecision(6)));
  }

  function chart(vals, other) {
    var w = 640, h = 110, pad = 4, lo = Infinity, hi = -Infinity, i;
    [vals, other].forEach(function (arr) {
      if (!arr) return;
      for (i = 0; i < arr.length; i++) {
        if (Number.isFinite(arr[i])) { lo = Math.min(lo, arr[i]); hi = Math.max(hi, arr[i]); }
      }
    });
    if (lo === Infinity) { lo = -1; hi = 1; }
    if (hi === lo) { hi = lo + 1; }
    var svg = svgEl("svg", {width: w, height: h, viewBox: "0 0 " + w + " " + h, "class": "kvf-chart"});
    var step = (w - 2 * pad) / Math.max(vals.length - 1, 1);
    function y(v) { return h - pad - (v - lo) / (hi - lo) * (h - 2 * pad); }
    svg.appendChild(svgEl("line", {x1: pad, x2: w - pad, y1: y(Math.min(Math.max(0, lo), hi)),
                                   y2: y(Math.min(Math.max(0, lo), hi)), stroke: "#bbb"}));
    function line(arr, colour) {
      var pts = [];
      for (i = 0; i < arr.length; i++) {
        var x = pad + i * step;
        if (Number.isFinite(arr[i])) pts.push(x.toFixed(1) + "," + y(arr[i]).toFixed(1));
        else svg.appendChild(svgEl("rect", {x: x - 1, y: 0, width: 2, height: h, "class": Number.isNaN(arr[i]) ?
                                             "kvf-nan" : "kvf-inf"}));
      }
      svg.appendChild(svgEl("polyline", {points: pts.join(" "), fill: "none", stroke: colour, "stroke-width": 1}));
    }
    if (other) line(other, "#fb8500");
    line(vals, "#023047");
    return svg;
  }

  function valueTable(vals, other, caption) {
    var table = el("table", "kvf-values"), tr;
    table.appendChild(el("caption", "", caption));
    for (var i = 0; i < vals.length; i++) {
      if (i % 8 === 0) { tr = el("tr"); tr.appendChild(el("td", "kvf-idx", String(i))); table.appendChild(tr); }
      var differs = other && !(fmt(vals[i]) === fmt(other[i]));
      tr.appendChild(el("td", differs ? "kvf-differs" : "", fmt(vals[i])));
    }
    return table;
  }

  function bytesBlock(lines, other) {
    var pre = el("pre", "kvf-bytes"), theirs = {};
    if (other) other.forEach(function (l) { theirs[l[0]] = l[1]; });
    lines.forEach(function (l) {
      var off = ("00000000" + l[0].toString(16)).slice(-8), hex = l[1].split(" ");
      var cmp = theirs[l[0]] ? theirs[l[0]].split(" ") : null;
      pre.appendChild(document.createTextNode(off + "  "));
      hex.forEach(function (b, i) {
        var same = !cmp || cmp[i] === b;
        pre.appendChild(same ? document.createTextNode(b) : el("mark", "", b));
        if (i < hex.length - 1) pre.appendChild(document.createTextNode(" "));
      });
      var width = hex.length * 3 - 1;
      pre.appendChild(document.createTextNode(" ".repeat(Math.max(47 - width, 0)) + "  | " + l[2] + "\n"));
    });
    return pre;
  }

  function revealMark(pre) {
    // a long row scrolls inside its box: bring the first differing byte into sight
    var mark = pre.querySelector("mark");
    if (mark) pre.scrollTop = Math.max(0, mark.offsetTop - 48);
  }

  function dataOf(cacheEl) {
    if (!cacheEl.kvfData) cacheEl.kvfData = JSON.parse(cacheEl.querySelector("script.kvf-data").textContent);
    return cacheEl.kvfData;
  }

  function showRow(cacheEl, page, row) {
    var data = dataOf(cacheEl), status = cacheEl.querySelector(".kvf-status");
    var pg = data.pages[String(page)];
    var section = cacheEl.querySelector(".kvf-page[data-page=\"" + page + "\"]");
    if (!pg || !section) {
      status.textContent = "page " + page + " is summarised only: name it with --pages " + page + " to see its rows";
      return;
    }
    status.textContent = "";
    var item = pg.rows[row], view = section.querySelector(".kvf-rowview");
    section.querySelectorAll("rect.kvf-selected").forEach(function (r) { r.classList.remove("kvf-selected"); });
    section.querySelectorAll(".kvf-strip rect[data-row=\"" + row + "\"]").forEach(function (r) {
      r.classList.add("kvf-selected");
    });
    view.textContent = "";
    view.setAttribute("data-shown-row", String(row));
    view.appendChild(el("h4", "", "page " + page + " row " + row + " (slot " + (page * data.page_size + row) +
                        "): " + item.status));
    if (item.findings.length) {
      var ul = el("ul", "kvf-findings");
      item.findings.forEach(function (f) { ul.appendChild(el("li", "kvf-bad", f)); });
      view.appendChild(ul);
    }
    if (!item.regions) {
      view.appendChild(el("p", "kvf-none", "every byte of this row is zero: it was never written"));
      return;
    }
    var theirs = {};
    if (item.other) item.other.regions.forEach(function (r) { theirs[r.name] = floats(r.values); });
    if (item.other) view.appendChild(el("p", "kvf-note", "differs from " + data.other +
                                         ": its values in orange, differing values and bytes marked"));
    item.regions.forEach(function (r) {
      var vals = floats(r.values), other = theirs[r.name];
      view.appendChild(el("h5", "", r.name + " (" + r.dtype + ", " + r.role + ") at byte " + r.offset));
      if (r.role === "data") view.appendChild(chart(vals, other));
      var box = el("div", "kvf-tables");
      box.appendChild(valueTable(vals, other, other ? "this file" : "decoded values"));
      if (other) box.appendChild(valueTable(other, vals, data.other));
      view.appendChild(box);
    });
    view.appendChild(el("h5", "", "bytes (as kvformats dump --rows prints them)"));
    revealMark(view.appendChild(bytesBlock(item.lines, item.other ? item.other.lines : null)));
    if (item.other) {
      view.appendChild(el("h5", "", "bytes in " + data.other));
      revealMark(view.appendChild(bytesBlock(item.other.lines, item.lines)));
    }
    if (view.scrollIntoView) view.scrollIntoView({block: "nearest"});
  }

  function init(root) {
    if (root.getAttribute("data-kvf-ready")) return;
    root.setAttribute("data-kvf-ready", "1");
    root.addEventListener("click", function (ev) {
      var target = ev.target.closest ? ev.target.closest("[data-row]") : null;
      if (!target || !root.contains(target)) return;
      var cacheEl = target.closest("[data-cache]"), pageEl = target.closest("[data-page]");
      if (!cacheEl || !pageEl) return;
      showRow(cacheEl, Number(pageEl.getAttribute("data-page")), Number(target.getAttribute("data-row")));
    });
  }

  document.querySelectorAll(".kvf").forEach(init);
})();
"""
