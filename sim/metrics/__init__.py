"""What a run measured: request and step records, the metrics of vllm bench serve, anomalies and fairness, decision
traces, intervals and the verdict.
"""
