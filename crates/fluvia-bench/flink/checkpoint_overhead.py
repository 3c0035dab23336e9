"""The keyed running count of `fluvia-bench checkpoints` on Flink 2.3 (PyFlink's
local mini-cluster, pure SQL as the anchors' `bench_flink_stream.py`), with
checkpoints off and every second: rows/s and their ratio.

Run with the interpreter `../shared/anchors/setup.sh` installs:
    .../venv/bin/python crates/fluvia-bench/flink/checkpoint_overhead.py --rows 50000000
"""
import argparse
import tempfile
import time


def run(rows, parallelism, interval):
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    conf = Configuration()
    conf.set_string("parallelism.default", str(parallelism))
    conf.set_string("table.exec.resource.default-parallelism", str(parallelism))
    if interval:
        conf.set_string("execution.checkpointing.interval", interval)
        conf.set_string("execution.checkpointing.dir", "file://" + tempfile.mkdtemp())
    settings = EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(conf).build()
    t_env = TableEnvironment.create(settings)
    t_env.execute_sql(f"""CREATE TEMPORARY TABLE src (a BIGINT, b BIGINT, c INT, d INT) WITH (
        'connector' = 'datagen', 'number-of-rows' = '{rows}', 'rows-per-second' = '1000000000000',
        'fields.c.min' = '0', 'fields.c.max' = '99', 'fields.d.min' = '0', 'fields.d.max' = '999999')""")
    t_env.execute_sql("CREATE TEMPORARY TABLE snk (k INT, cnt BIGINT) WITH ('connector' = 'blackhole')")
    res = t_env.execute_sql("INSERT INTO snk SELECT d % 1000, COUNT(*) FROM src GROUP BY d % 1000")
    jr = res.get_job_client().get_job_execution_result().result()
    return rows / (jr.get_net_runtime() / 1000.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=50_000_000)
    ap.add_argument("--parallelism", type=int, default=1)
    a = ap.parse_args()
    print("| Flink 2.3 case | M rows/s | vs off |")
    print("|---|---|---|")
    off = None
    for interval in [None, "1 s"]:
        rate = run(a.rows, a.parallelism, interval)
        off = off or rate
        label = f"p{a.parallelism}, checkpoints {'every ' + interval if interval else 'off'}"
        print(f"| {label} | {rate / 1e6:.2f} | {rate / off:.3f} |", flush=True)


if __name__ == "__main__":
    t0 = time.time()
    main()
