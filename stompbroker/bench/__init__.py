"""Load generator for STOMP brokers: this one (--spawn) or any other (--host/--port, --ws URL).

Examples (``stompbroker-bench`` is installed with the package; ``python -m stompbroker.bench`` works too):

    stompbroker-bench --spawn "processors=4" --scenario all --out out/bench
    stompbroker-bench --host 127.0.0.1 --port 61613 --ws ws://127.0.0.1:15674/ws \\
        --login guest --passcode guest --pid $(pgrep -f beam.smp) --scenario ingest,one2one --out out/rabbit
    stompbroker-bench --spawn "processors=3" --compare base=git:b89f1bc main=git:main other=127.0.0.1:61614 \
        --scenario ingest,one2one,queue,fanout,latency,idle --repeat 3
    stompbroker-bench --spawn "processors=3" --scenario queue --profile
    stompbroker-bench --compare out/bench out/rabbit

Producers keep at most --bursts (4) bursts of at most --burst-bytes (16 KB) unreceipted (``--flow
window``: the old large window, labelled a ceiling). ``--compare`` runs the same rows against each
target and prints medians and ratios; ``--profile`` reports each broker process's CPU per frame.

Scenarios (``--scenario NAME[,NAME...]`` or ``all``): ingest, one2one, fanout, queue, latency, idle,
durable. Each writes one object per run into ``OUT/results.json`` and a chart into ``OUT/bench.png``
(matplotlib: the ``bench`` extra). See docs/performance.md for what each one measures and how.

Design (why the generator is much faster than the broker it measures): hand-written STOMP over raw
sockets, frames rendered once and sent in ~64 KB batches with one send call each, frames counted
with one ``bytes.count`` per read (NUL on TCP, a body token on WebSocket), several worker
processes, and a self-measurement (``--ceiling``) against a trivial sink/source on loopback.

Modules: ``cli`` (command line), ``scenarios`` (what each scenario runs and reports), ``runner`` (one
measured run, the ceiling, results.json), ``workers`` (producer, consumer and idle-connection
processes), ``flowctl`` (the producers' flow control), ``compare`` (targets, the table of ratios),
``profile`` (py-spy per process, cost per frame), ``wire`` (framing, connection set-up, counting),
``mock`` (the trivial sink, source and relay), ``procs`` (the broker's processes and the machine),
``stats`` and ``report`` (schema, chart, summary).
"""
