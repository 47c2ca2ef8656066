"""``levers audit --html FILE``: the audit as one self-contained page.

Everything is inline (styles, data, the script that draws the SVG plots): the page opens from
disk with no network, and can be attached to an issue or a pull request as one file. It holds
the step summary, the ranked findings with their receipts and the code on each line, time by
module and by op class, the memory timeline of the step with its peak marked and the
activation-checkpointing what-if beside it, and the SDPA calls with their backends and the reasons
the others were ruled out.

The tables are written here; the plots are drawn by the page's script from a JSON blob, which
then sets ``data-rendered`` on ``<body>`` to the number of plots drawn (what the browser test
reads). A script error is written into ``data-errors`` and shown at the top of the page.
"""

from __future__ import annotations

import html
import json
import os
from typing import Any

from levers.audit.report_format import cost_line, lever_text, relative_path
from levers.audit.rules.attn001_sdpa_math_fallback import backend_choice
from levers.audit.summary import module_label
from levers.capture.records import Capture, OpRecord
from levers.output.atomic import atomic_write_text
from levers.units import format_share

_MAX_TIMELINE_POINTS = 1500
_TOP_MODULES = 12

# op name fragments -> op class, first match wins (names are aten.<op>.<overload>)
_OP_CLASSES = (
    ("attention", ("scaled_dot_product", "_flash_attention", "_efficient_attention", "_cudnn_attention")),
    ("matmul", ("aten.mm.", "aten.bmm.", "aten.addmm.", "aten.baddbmm.", "aten.matmul.",
                "aten.linear.", "convolution", "aten._addmm_activation.")),
    ("norm", ("layer_norm", "rms_norm", "group_norm", "batch_norm")),
    ("optimizer (foreach/fused)", ("aten._foreach_", "aten._fused_")),
    ("softmax / reduction", ("softmax", "aten.sum.", "aten.mean.", "aten.amax.", "aten.max.",
                             "aten.logsumexp.", "aten.var", "nll_loss", "aten.norm.")),
    ("copy / cast", ("aten._to_copy.", "aten.copy_.", "aten.clone.", "aten.cat.",
                     "aten.contiguous", "aten.index", "aten.embedding", "aten.gather.",
                     "aten.scatter")),
)


def op_class(op: OpRecord) -> str:
    """A coarse class of an op for the time-by-class plot."""
    if op.is_view:
        return "views (no data moved)"
    for name, fragments in _OP_CLASSES:
        if any(f in op.name for f in fragments):
            return name
    return "elementwise / other"


def _op_time_us(op: OpRecord, on_gpu: bool) -> float:
    return float(op.device_us or 0.0) if on_gpu else op.wall_us


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _mib(num_bytes: float | None) -> str:
    if num_bytes is None:
        return "n/a"
    return f"{num_bytes / 2**20:,.2f} MiB"


def _bars(totals: dict[str, float], limit: int | None = None) -> list[dict[str, Any]]:
    rows = sorted(totals.items(), key=lambda kv: -kv[1])
    if limit is not None and len(rows) > limit:
        rest = sum(v for _, v in rows[limit:])
        rows = rows[:limit] + [(f"({len(rows) - limit} more)", rest)]
    return [{"label": k, "value": v} for k, v in rows]


def plot_data(capture: Capture, memory: Any = None, mem_finding: Any = None) -> dict[str, Any]:
    """The numbers the page's script draws."""
    on_gpu = bool(capture.kernels)
    by_module: dict[str, float] = {}
    by_class: dict[str, float] = {}
    for op in capture.ops:
        t = _op_time_us(op, on_gpu)
        by_module[module_label(op.module)] = by_module.get(module_label(op.module), 0.0) + t
        by_class[op_class(op)] = by_class.get(op_class(op), 0.0) + t
    # fold module paths to their first two levels so that the plot reads as the model's parts
    folded: dict[str, float] = {}
    for path, t in by_module.items():
        key = ".".join(path.split(".")[:3]) if not path.startswith("<") else path
        folded[key] = folded.get(key, 0.0) + t
    step = max(1, len(capture.ops) // _MAX_TIMELINE_POINTS)
    timeline = [
        {"i": op.index, "b": op.live_bytes, "p": op.phase}
        for op in capture.ops[::step]
        if op.live_bytes is not None
    ]
    peak = capture.memory.peak_op
    if peak is not None and peak < len(capture.ops) and capture.ops[peak].live_bytes is not None:
        timeline.append({"i": peak, "b": capture.ops[peak].live_bytes, "p": capture.ops[peak].phase})
        timeline.sort(key=lambda r: r["i"])
    return {
        "time_unit": "device µs" if on_gpu else "host µs (CPU wall time)",
        "by_module": _bars(folded, _TOP_MODULES),
        "by_class": _bars(by_class),
        "timeline": timeline,
        "peak": {"index": peak, "bytes": capture.memory.peak_bytes,
                 "start_bytes": capture.memory.start_bytes, "source": capture.memory.source},
        "whatif": _whatif(capture, memory, mem_finding),
    }


def _whatif(capture: Capture, memory: Any, mem_finding: Any) -> dict[str, Any]:
    """The activation-checkpointing what-if: from the memory model, else MEM001's estimate."""
    if memory is not None and memory.checkpointing_applicable:
        return {
            "source": f"levers memory on {memory.gpu} (predicted)",
            "now_bytes": memory.peak_allocated_bytes,
            "after_bytes": memory.peak_allocated_bytes + memory.checkpointing_delta_allocated_bytes,
            "note": memory.checkpointing_note,
        }
    if mem_finding is not None:
        details = mem_finding.details or {}
        peak = details.get("peak_bytes", capture.memory.peak_bytes)
        freed = details.get("headroom_bytes") or 0
        return {
            "source": "estimate from the capture's live-bytes timeline",
            "now_bytes": peak,
            "after_bytes": peak - freed,
            "note": "per-block checkpointing of the repeated blocks (MEM001)",
        }
    note = memory.checkpointing_note if memory is not None else (
        "MEM001 did not fire: no repeated blocks whose activations checkpointing would free, or "
        "checkpointing is already on"
    )
    return {"source": None, "now_bytes": capture.memory.peak_bytes, "after_bytes": None, "note": note}


def _summary_rows(capture: Capture, report: Any) -> list[tuple[str, str]]:
    head = report.head
    total_flops = sum(op.flops for op in capture.ops)
    total_bytes = sum(op.read_bytes + op.write_bytes for op in capture.ops)
    rows = [
        ("workload", f"{head.workload} {json.dumps(head.params)}"),
        ("ran on", f"{head.device} · torch {capture.env.get('torch')}"),
        ("ops", f"{len(capture.ops):,} aten ops in one step"),
        ("FLOPs", f"{total_flops / 1e9:,.3f} GFLOP (counted)"),
        ("bytes moved", f"{total_bytes / 2**20:,.1f} MiB (counted)"),
        ("time / step", f"{head.step_s * 1e3:,.2f} ms (measured on {head.device})"
         + (f" · {head.estimated_step_s * 1e3:,.3f} ms estimated on {head.gpu_title}"
            if head.estimated_step_s is not None else "")),
        ("MFU", f"{format_share(head.mfu)} ({head.mfu_provenance})" if head.mfu is not None else "n/a"),
        ("peak memory", f"{_mib(head.peak_bytes)} ({head.peak_provenance})"),
    ]
    if head.tokens_per_s is not None:
        rows.append(("tokens/s", f"{head.tokens_per_s:,.0f} (measured)"))
    rows += [("note", a) for a in head.assumptions]
    return rows


def _findings_html(report: Any) -> str:
    if not report.findings:
        return "<p class='ok'>No findings.</p>"
    parts = []
    inapplicable = getattr(report.recommendation, "inapplicable", None)
    for rank, f in enumerate(report.findings, 1):
        receipts = []
        for r in f.receipts:
            where = f"{relative_path(r.file)}:{r.line}" if r.file else "(no source line)"
            if r.file and r.end_line and r.end_line != r.line:
                where += f"-{r.end_line}"
            receipts.append(
                "<div class='receipt'>"
                f"<div class='where'>{_esc(where)}</div>"
                f"<pre class='code'>{_esc(r.code or '')}</pre>"
                f"<div class='meta'>{_esc(' · '.join(x for x in (r.module, r.op, r.shapes) if x))}"
                f"{' · ' + str(r.count) + 'x per step' if (r.count or 0) > 1 else ''}</div>"
                "</div>"
            )
        parts.append(
            f"<li class='finding sev-{_esc(f.severity)}' data-code='{_esc(f.code)}'>"
            f"<div class='title'><span class='rank'>{rank}.</span> <b>{_esc(f.code)}</b> "
            f"{_esc(f.name)} <span class='sev'>[{_esc(f.severity)}]</span> "
            f"<span class='eff'>effort {_esc(f.effort)} · risk {_esc(f.risk)}</span></div>"
            f"{''.join(receipts)}"
            f"<p class='what'>{_esc(f.message)}</p>"
            f"<p class='cost'>{_esc(cost_line(f))}</p>"
            f"<p class='fix'>fix: {_esc(f.fix_title)} <span class='lever'>({_esc(lever_text(f, inapplicable))})"
            "</span></p></li>"
        )
    return f"<ol class='findings'>{''.join(parts)}</ol>"


def _already_right_html(report: Any) -> str:
    if not report.already_right:
        return ""
    items = "".join(
        f"<li>✓ {_esc(getattr(a, 'title', ''))}: {_esc(getattr(a, 'detail', ''))} "
        f"[{_esc(getattr(a, 'code', ''))}]</li>"
        for a in report.already_right
    )
    return f"<h2>Already right</h2><ul class='right'>{items}</ul>"


def _sdpa_html(capture: Capture, config: Any) -> str:
    calls = [c for c in capture.calls if c.kind == "sdpa"]
    if not calls:
        return "<p>No scaled_dot_product_attention calls in the step.</p>"
    choice_of = None
    if config is not None:
        choice_of = lambda call: backend_choice(call, capture, config)  # noqa: E731
    rows = []
    for call in calls:
        a = call.args

        def shape(key: str) -> str:
            m = a.get(key)
            return f"[{', '.join(map(str, m['shape']))}] {m['dtype']}" if isinstance(m, dict) else "none"

        target, reasons = "", ""
        if choice_of is not None:
            try:
                ran, choice, _dtype = choice_of(call)
                target = ran
                reasons = "; ".join(f"{b}: {r}" for b, r in choice.ruled_out.items())
            except (KeyError, TypeError, ValueError) as exc:
                target, reasons = "?", f"not modelled: {exc}"
        where = str(call.source) if call.source is not None else ""
        rows.append(
            "<tr>"
            f"<td>{_esc(where)}</td><td>{_esc(call.module or '')}</td>"
            f"<td>{_esc(shape('query'))}</td><td>{_esc(shape('key'))}</td>"
            f"<td>{_esc(shape('attn_mask'))}</td><td>{_esc(a.get('is_causal'))}</td>"
            f"<td>{_esc(a.get('backend_ran', ''))}</td><td><b>{_esc(target)}</b></td>"
            f"<td class='reasons'>{_esc(reasons)}</td></tr>"
        )
    gpu = getattr(getattr(config, "gpu", None), "title", "") if config is not None else ""
    return (
        "<table class='sdpa'><tr><th>source</th><th>module</th><th>query</th><th>key</th>"
        f"<th>mask</th><th>causal</th><th>ran here</th><th>backend on {_esc(gpu)}</th>"
        f"<th>why not the others</th></tr>{''.join(rows)}</table>"
    )


_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#1d2430;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde2ea;padding-bottom:4px}
table{border-collapse:collapse;width:100%}td,th{padding:3px 8px;border-bottom:1px solid #eef1f5;text-align:left;vertical-align:top}
th{font-weight:600;background:#f6f8fb}.summary td:first-child{width:140px;color:#5a6577}
.findings{padding-left:0;list-style:none}.finding{border:1px solid #dde2ea;border-left:5px solid #999;border-radius:6px;padding:8px 12px;margin:10px 0}
.sev-high{border-left-color:#d0453b}.sev-medium{border-left-color:#e09b2d}.sev-low{border-left-color:#6b9bd2}
.title{font-size:15px}.sev{color:#8a5a00}.eff{color:#5a6577;margin-left:8px}.receipt{margin:6px 0 6px 12px}
.where{font-family:ui-monospace,Menlo,monospace;color:#2b5fb3}.code{background:#f6f8fb;margin:2px 0;padding:4px 8px;border-radius:4px;white-space:pre-wrap}
.meta{color:#5a6577;font-size:12px}.what,.cost,.fix{margin:4px 0}.cost{color:#5a6577}.lever{color:#5a6577}
.plots{display:grid;grid-template-columns:1fr 1fr;gap:16px}.plot{border:1px solid #dde2ea;border-radius:6px;padding:8px}
.plot h3{font-size:14px;margin:0 0 6px}.plot svg{max-height:300px;display:block}svg text{font:11px system-ui,sans-serif;fill:#1d2430}.wide{grid-column:1/3}
.reasons{font-size:12px;color:#5a6577}.sdpa td{font-size:12px}#errors{color:#b00020;font-weight:600}.ok{color:#1d7a3a}
.right{list-style:none;padding-left:8px}.legend span{display:inline-block;margin-right:12px;font-size:12px}
"""

_SCRIPT = r"""
(function(){
  var errors=[];
  window.onerror=function(msg,src,line){errors.push(msg+' (line '+line+')');
    document.body.setAttribute('data-errors',errors.join(' | '));
    document.getElementById('errors').textContent='page error: '+errors.join(' | ');};
  var D=JSON.parse(document.getElementById('levers-data').textContent);
  var NS='http://www.w3.org/2000/svg';
  var COLORS={forward:'#4c78a8',backward:'#f58518',optimizer:'#54a24b',other:'#9d755d'};
  function el(tag,attrs,text){var e=document.createElementNS(NS,tag);
    for(var k in attrs){e.setAttribute(k,attrs[k]);} if(text!==undefined){e.textContent=text;} return e;}
  function fmtBytes(b){var u=['B','KiB','MiB','GiB'],i=0;while(Math.abs(b)>=1024&&i<3){b/=1024;i++;}return b.toFixed(i?2:0)+' '+u[i];}
  function fmtUs(us){return us>=1000?(us/1000).toFixed(2)+' ms':us.toFixed(1)+' µs';}
  function bars(id,rows,unit){
    var host=document.getElementById(id); var W=560,row=20,left=210,H=rows.length*row+24;
    var svg=el('svg',{width:'100%',viewBox:'0 0 '+W+' '+H,role:'img'});
    var max=Math.max.apply(null,rows.map(function(r){return r.value;}).concat([1e-9]));
    var total=rows.reduce(function(s,r){return s+r.value;},0)||1;
    rows.forEach(function(r,i){var y=i*row+4,w=(W-left-110)*r.value/max;
      svg.appendChild(el('text',{x:left-6,y:y+13,'text-anchor':'end'},r.label.length>32?'…'+r.label.slice(-31):r.label));
      svg.appendChild(el('rect',{x:left,y:y+2,width:Math.max(w,1),height:row-6,fill:'#4c78a8'}));
      svg.appendChild(el('text',{x:left+w+4,y:y+13},fmtUs(r.value)+' · '+(100*r.value/total).toFixed(1)+'%'));});
    svg.appendChild(el('text',{x:left,y:H-4,fill:'#5a6577'},unit));
    host.appendChild(svg); return 1;}
  function timeline(id){
    var host=document.getElementById(id), T=D.timeline; if(!T.length){host.textContent='no live-bytes timeline in this capture';return 0;}
    var W=760,H=260,L=70,R=10,TOP=14,B=30;
    var svg=el('svg',{width:'100%',viewBox:'0 0 '+W+' '+H,role:'img'});
    var maxI=T[T.length-1].i||1, maxB=Math.max(D.peak.bytes,Math.max.apply(null,T.map(function(p){return p.b;})))||1;
    function x(i){return L+(W-L-R)*i/maxI;} function y(b){return TOP+(H-TOP-B)*(1-b/maxB);}
    for(var k=0;k<T.length-1;k++){svg.appendChild(el('rect',{x:x(T[k].i),y:TOP,width:Math.max(x(T[k+1].i)-x(T[k].i),0.5),height:H-TOP-B,fill:COLORS[T[k].p]||'#ccc',opacity:0.12}));}
    var d=T.map(function(p,k){return (k?'L':'M')+x(p.i).toFixed(1)+' '+y(p.b).toFixed(1);}).join(' ');
    svg.appendChild(el('path',{d:d,fill:'none',stroke:'#1d2430','stroke-width':1.4}));
    for(var g=0;g<=4;g++){var b=maxB*g/4;svg.appendChild(el('text',{x:L-6,y:y(b)+4,'text-anchor':'end'},fmtBytes(b)));
      svg.appendChild(el('line',{x1:L,x2:W-R,y1:y(b),y2:y(b),stroke:'#eef1f5'}));}
    svg.appendChild(el('text',{x:L,y:H-8},'op index (0 … '+maxI+')'));
    if(D.peak.index!==null){var px=x(D.peak.index),py=y(D.peak.bytes);
      svg.appendChild(el('line',{x1:px,x2:px,y1:TOP,y2:H-B,stroke:'#d0453b','stroke-dasharray':'4 3'}));
      svg.appendChild(el('circle',{cx:px,cy:py,r:4,fill:'#d0453b',class:'peak'}));
      svg.appendChild(el('text',{x:Math.min(px+6,W-150),y:Math.max(py-6,TOP+10),fill:'#d0453b'},'peak '+fmtBytes(D.peak.bytes)+' at op '+D.peak.index));}
    host.appendChild(svg);
    var leg=document.createElement('div');leg.className='legend';
    Object.keys(COLORS).forEach(function(p){var s=document.createElement('span');s.textContent='■ '+p;s.style.color=COLORS[p];leg.appendChild(s);});
    host.appendChild(leg); return 1;}
  function whatif(id){
    var host=document.getElementById(id), w=D.whatif; var W=340,H=230,B=40,TOP=20;
    var svg=el('svg',{width:'100%',viewBox:'0 0 '+W+' '+H,role:'img'});
    var vals=[['now',w.now_bytes,'#4c78a8']]; if(w.after_bytes!==null){vals.push(['with checkpointing',w.after_bytes,'#54a24b']);}
    var max=Math.max.apply(null,vals.map(function(v){return v[1];}))||1;
    vals.forEach(function(v,k){var h=(H-B-TOP)*v[1]/max,x0=40+k*150;
      svg.appendChild(el('rect',{x:x0,y:H-B-h,width:100,height:h,fill:v[2]}));
      svg.appendChild(el('text',{x:x0+50,y:H-B-h-4,'text-anchor':'middle'},fmtBytes(v[1])));
      svg.appendChild(el('text',{x:x0+50,y:H-B+16,'text-anchor':'middle'},v[0]));});
    host.appendChild(svg);
    var p=document.createElement('p');p.className='meta';p.textContent=(w.source?w.source+': ':'no what-if: ')+(w.note||'');host.appendChild(p);
    return 1;}
  var n=0;
  n+=bars('plot-modules',D.by_module,D.time_unit);
  n+=bars('plot-classes',D.by_class,D.time_unit);
  n+=timeline('plot-timeline');
  n+=whatif('plot-whatif');
  document.body.setAttribute('data-rendered',String(n));
})();
"""


def render_html(capture: Capture, report: Any, *, config: Any = None, memory: Any = None) -> str:
    """The page for ``capture`` and its findings ``report``."""
    mem_finding = next((f for f in report.findings if f.code == "MEM001"), None)
    data = json.dumps(plot_data(capture, memory, mem_finding), allow_nan=False)
    data = data.replace("</", "<\\/")  # no "</script>" inside the data block
    summary = "".join(f"<tr><td>{_esc(k)}</td><td>{_esc(v)}</td></tr>" for k, v in _summary_rows(capture, report))
    title = f"levers audit {capture.workload}"
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_esc(title)}</title><style>{_STYLE}</style></head>"
        "<body data-rendered='0' data-errors=''>"
        "<div id='errors'></div>"
        f"<h1>{_esc(title)}</h1>"
        f"<div class='meta'>levers {_esc(capture.env.get('levers'))} "
        f"({_esc(capture.env.get('levers_commit') or 'no commit')}) · findings for "
        f"{_esc(report.head.gpu_title)}</div>"
        f"<h2>Step</h2><table class='summary'>{summary}</table>"
        f"<h2>Findings ({len(report.findings)}, ranked by payoff)</h2>{_findings_html(report)}"
        f"{_already_right_html(report)}"
        "<h2>Where the step goes</h2><div class='plots'>"
        "<div class='plot'><h3>Time by module</h3><div id='plot-modules'></div></div>"
        "<div class='plot'><h3>Time by op class</h3><div id='plot-classes'></div></div>"
        "<div class='plot'><h3>Memory during the step (live tensor bytes after each op)</h3>"
        "<div id='plot-timeline'></div></div>"
        "<div class='plot'><h3>Activation checkpointing: what if</h3><div id='plot-whatif'></div></div>"
        "</div>"
        f"<h2>SDPA calls</h2>{_sdpa_html(capture, config)}"
        f"<script type='application/json' id='levers-data'>{data}</script>"
        f"<script>{_SCRIPT}</script></body></html>\n"
    )


def write_html(
    capture: Capture, report: Any, path: str | os.PathLike[str], *, config: Any = None,
    memory: Any = None,
) -> None:
    """Write the page to ``path`` atomically."""
    atomic_write_text(path, render_html(capture, report, config=config, memory=memory))
