"""The report's stylesheet, scoped under ``.kvf`` (a notebook page holds other outputs too)."""

CSS = """
.kvf{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;font-size:14px;color:#1d1d1d;line-height:1.35}
.kvf h1{font-size:22px;margin:8px 0}
.kvf h2{font-size:18px;margin:18px 0 6px;border-bottom:1px solid #ccc}
.kvf h3{font-size:16px;margin:14px 0 4px}
.kvf h4{font-size:14px;margin:10px 0 4px}
.kvf h5{font-size:13px;margin:8px 0 2px}
.kvf-cache{border-top:3px solid #219ebc;margin-top:18px;padding-top:4px}
.kvf-card{display:grid;grid-template-columns:max-content auto;gap:2px 12px;margin:6px 0}
.kvf-card dt{font-weight:600;color:#555}
.kvf-card dd{margin:0;font-family:ui-monospace,Menlo,monospace;font-size:12.5px;overflow-wrap:anywhere}
.kvf-table{border-collapse:collapse;margin:6px 0;font-size:12.5px}
.kvf-table th,.kvf-table td{border:1px solid #ddd;padding:2px 6px;text-align:left}
.kvf-table th{background:#f4f4f4}
.kvf-note{color:#666;font-weight:normal;margin-left:6px;font-size:12px}
.kvf-ok{color:#2b7a0b}
.kvf-bad{color:#c1121f;font-weight:700}
.kvf-none{color:#888;margin:2px 0}
.kvf-leftout{background:#fff7e0;border-left:4px solid #fb8500;padding:4px 8px}
.kvf-status:empty{display:none}
.kvf-status{background:#fdecea;padding:4px 8px}
.kvf-meta{max-height:320px;overflow:auto;background:#f7f7f7;padding:6px;font-size:12px;white-space:pre-wrap}
.kvf-page{border:1px solid #ddd;border-radius:4px;padding:4px 10px;margin:10px 0}
.kvf-page:target{border-color:#219ebc;box-shadow:0 0 0 2px #8ecae6}
.kvf-pagehead{color:#555;margin:0 0 4px}
.kvf-figs{display:flex;flex-wrap:wrap;gap:10px;align-items:flex-start}
.kvf-fig{margin:4px 0;border:1px solid #eee;padding:4px}
.kvf-fig figcaption{font-size:12px;font-weight:600;margin-bottom:2px}
.kvf-axis{font-size:9px;fill:#666}
.kvf rect[data-row]{cursor:pointer}
.kvf-band:hover{fill:rgba(0,0,0,.15)}
.kvf-pixels{image-rendering:pixelated}
.kvf-st-written{fill:#219ebc}.kvf-st-zero{fill:#d9d9d9}.kvf-st-failing{fill:#d62828}
.kvf-pg-written{fill:#219ebc}.kvf-pg-partial{fill:#8ecae6}.kvf-pg-zero{fill:#d9d9d9}.kvf-pg-failing{fill:#d62828}
rect.kvf-differs{stroke:#fb8500;stroke-width:2}
rect.kvf-selected{stroke:#000;stroke-width:2}
.kvf-nan{fill:#d62828}.kvf-inf{fill:#c200c2}.kvf-saturated{fill:#fb8500}.kvf-bar{fill:#219ebc}
.kvf-key{display:inline-block;padding:0 6px;margin-right:6px;border-radius:3px;font-size:12px}
.kvf-key.kvf-pg-written{background:#219ebc;color:#fff}.kvf-key.kvf-pg-partial{background:#8ecae6}
.kvf-key.kvf-pg-zero{background:#d9d9d9}.kvf-key.kvf-pg-failing{background:#d62828;color:#fff}
.kvf-key.kvf-differs{border:2px solid #fb8500}
.kvf-rowview{border-top:1px dashed #bbb;margin-top:6px;padding-top:4px}
.kvf-rowview pre{position:relative;font-family:ui-monospace,Menlo,monospace;font-size:12px;background:#f7f7f7;
  padding:6px;max-height:360px;overflow:auto}
.kvf-values{border-collapse:collapse;font-family:ui-monospace,Menlo,monospace;font-size:11.5px}
.kvf-values td{padding:0 5px;text-align:right;border-bottom:1px solid #f0f0f0}
.kvf-values td.kvf-idx{color:#999}
.kvf-values caption{text-align:left;font-weight:600;font-family:system-ui,sans-serif;color:#555}
.kvf mark,.kvf td.kvf-differs{background:#ffd166}
.kvf-tables{display:flex;gap:16px;flex-wrap:wrap;max-height:300px;overflow:auto}
.kvf-go{cursor:pointer}
"""
