"""Engine-neutral serving metrics: scrape Triton and vLLM, turn two scrapes into rates.

Three sources of latency and traffic figures, all plain Python (no Django):

* ``scraping.scrape`` reads a server's Prometheus ``/metrics`` page into a ``Snapshot`` of
  cumulative ``Counters`` per (model, version) (``values``), parsed by ``parsing`` through
  ``prometheus_client.parser`` only; ``rates.window`` turns two of them into a ``Window`` of
  rates, error rate and latency quantiles.
* ``prometheus.PrometheusSource`` asks a Prometheus server (which scrapes the engines) through
  its HTTP query API; the PromQL it builds is documented on its ``latency_query``.
* ``values.RequestLogSource`` is the seam for per-request samples from a traffic proxy (nginx,
  Envoy): no implementation here.
"""
