// graphile-worker's side of `python -m benchmarks postgres` (not part of trio-jobs).
//
// Run by benchmarks/postgres.py with NODE_PATH pointing at the copy of
// graphile-worker it installs under benchmarks/.work/ (`npm install
// graphile-worker`). One invocation is one run, in its own (fresh) schema:
//
//   node _peer_graphile.cjs '{"dsn": ..., "schema": ..., "workload": "noop",
//                             "jobs": 20000, "concurrency": 16, "batched": true}'
//
// It prints one JSON object on its last line. Workloads:
//
// noop          `jobs` no-op tasks added with WorkerUtils.addJobs (1,000 per call,
//               not timed), the table ANALYZEd (as autovacuum would), then one
//               worker pool (`run()`, `concurrency` as given) is timed from its
//               start until every job is settled. graphile-worker does not await
//               its completeJob (the row is deleted after the task's promise
//               resolves), so "settled" is the first moment, after the N-th
//               `job:success`, that a poll finds no job row left.
//               `batched` turns on graphile-worker's own batching (localQueue of
//               `concurrency` jobs, completeJobBatchDelay 0), its documented
//               high-throughput setting.
// enqueue_many  addJobs of 1,000, timed per call.
// prepare       `jobs` no-op tasks added (1,000 per call) and ANALYZEd; exits.
// serve         one worker pool (`concurrency`, `batched` as above) that prints
//               "ready" once its pool connects, starts on a line on stdin, and
//               runs until killed (benchmarks/postgres.py times N of them from
//               the go until no job row is left).
"use strict";

const { run, makeWorkerUtils, Logger } = require("graphile-worker");
const { EventEmitter } = require("events");
const { performance } = require("perf_hooks");

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

async function main() {
  const spec = JSON.parse(process.argv[2]);
  const n = spec.jobs | 0;
  const concurrency = spec.concurrency | 0 || 1;
  const connectionString = spec.dsn;
  const schema = spec.schema;
  const utils = await makeWorkerUtils({ connectionString, schema });
  const version = require("graphile-worker/package.json").version;
  try {
    await utils.migrate();
    const batch = (from, to) => {
      const specs = [];
      for (let i = from; i < to; i++) specs.push({ identifier: "noop", payload: { i } });
      return specs;
    };
    if (spec.workload === "enqueue_many") {
      const samples = [];
      const count = (spec.samples | 0) || 15;
      for (let k = 0; k < count + 3; k++) {
        const t = performance.now();
        await utils.addJobs(batch(k * 1000, (k + 1) * 1000));
        samples.push(performance.now() - t);
      }
      const ms = samples.slice(3);
      console.log(JSON.stringify({ median_ms: median(ms), samples_ms: ms, version }));
      return;
    }
    if (spec.workload === "serve") {
      await utils.withPgClient((c) => c.query("SELECT 1"));
      console.log("ready");
      await new Promise((resolve) => process.stdin.once("data", resolve));
      const preset = { worker: {} };
      if (spec.batched) {
        preset.worker.localQueue = { size: concurrency };
        preset.worker.completeJobBatchDelay = 0;
      }
      await run({
        connectionString,
        schema,
        concurrency,
        maxPoolSize: concurrency + 4,
        noHandleSignals: true,
        pollInterval: 2000,
        taskList: { noop: async () => {} },
        preset,
        logger: new Logger(() => () => {}), // quiet: nobody reads its stdout now
      });
      await new Promise(() => {}); // until killed
    }
    for (let s = 0; s < n; s += 1000) await utils.addJobs(batch(s, Math.min(n, s + 1000)));
    await utils.withPgClient((c) => c.query(`ANALYZE "${schema}"._private_jobs`));
    if (spec.workload === "prepare") {
      console.log(JSON.stringify({ prepared: n, version }));
      return;
    }

    const events = new EventEmitter();
    let succeeded = 0;
    let allRan;
    const ran = new Promise((resolve) => (allRan = resolve));
    events.on("job:success", () => {
      succeeded += 1;
      if (succeeded === n) allRan();
    });
    const preset = { worker: {} };
    if (spec.batched) {
      preset.worker.localQueue = { size: concurrency };
      preset.worker.completeJobBatchDelay = 0;
    }
    const started = performance.now();
    const runner = await run({
      connectionString,
      schema,
      concurrency,
      maxPoolSize: concurrency + 4,
      noHandleSignals: true,
      pollInterval: 2000,
      taskList: { noop: async () => {} },
      events,
      preset,
      logger: undefined,
    });
    await ran;
    // Settled: the completions (not awaited by the worker) have all landed.
    let settledAt = 0;
    await utils.withPgClient(async (c) => {
      for (;;) {
        const r = await c.query(`SELECT count(*)::int AS n FROM "${schema}"._private_jobs`);
        if (r.rows[0].n === 0) {
          settledAt = performance.now();
          return;
        }
      }
    });
    const seconds = (settledAt - started) / 1000;
    await runner.stop();
    console.log(JSON.stringify({ rate: n / seconds, seconds, finished: succeeded, version }));
  } finally {
    await utils.release();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
