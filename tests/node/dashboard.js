// The dashboard in a real browser (tests/integration/dashboard.t): Debian's
// chromium, headless, driven by playwright-core. Reads its settings as JSON
// from argv[2]; prints TAP-like "ok"/"not ok" lines that the shell test counts,
// and exits 1 when a step cannot go on. Nothing but the dashboard is fetched:
// every request the page makes is checked to go to its own origin.
"use strict";
const fs = require("fs");
const path = require("path");
const { chromium } = require("playwright-core");

const cfg = JSON.parse(process.argv[2]);
let failed = 0;
function check(cond, what, detail) {
  console.log((cond ? "ok - " : "not ok - ") + what);
  if (!cond) {
    failed++;
    if (detail !== undefined) console.log("#   " + String(detail).split("\n").join("\n#   "));
  }
}

// One train record as train writes it, for the running run's metrics file.
function record(step) {
  return JSON.stringify({
    type: "train", step, epoch: 1, loss: 2.3 / (1 + step / 20), accuracy: 1 - 1 / (1 + step / 20),
    lr: 0.05, samples_per_s: 1000, time_s: step / 10, step_time_s: 0.01, step_time_min_s: 0.009,
    step_time_max_s: 0.012, slowest_rank: 1, wall_time: Date.now() / 1000, run_id: cfg.live,
    restart: 0, rank: 0,
  }) + "\n";
}

async function main() {
  fs.mkdirSync(cfg.out, { recursive: true });
  const ctx = await chromium.launchPersistentContext(cfg.profile, {
    executablePath: cfg.chromium,
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", "--no-first-run"],
    viewport: { width: 1400, height: 1100 },
  });
  const origin = new URL(cfg.url).origin;
  const elsewhere = [];
  ctx.on("request", (r) => { if (!r.url().startsWith(origin) && !r.url().startsWith("data:")) elsewhere.push(r.url()); });
  const page = ctx.pages()[0] || (await ctx.newPage());
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  try {
    await page.goto(cfg.url);

    // The run list: a finished, a failed and a running run, with their states.
    await page.waitForFunction((n) => document.querySelectorAll("#runs tr").length >= n, 3, { timeout: 15000 });
    const states = await page.$$eval("#runs tr", (rows) => Object.fromEntries(rows.map((r) => [r.dataset.run, r.dataset.state])));
    check(states[cfg.done] === "succeeded", "the finished run is listed as succeeded", JSON.stringify(states));
    check(states[cfg.broken] === "failed", "the failed run is listed as failed", JSON.stringify(states));
    check(states[cfg.live] === "running", "the running run is listed as running", JSON.stringify(states));

    // The failed run: its root cause.
    await page.click(`#runs tr[data-run="${cfg.broken}"]`);
    await page.waitForSelector("#root-cause:not([hidden])", { timeout: 15000 });
    const cause = await page.textContent("#root-cause");
    check(cause.includes("Root cause (first failure):"), "the failed run shows its root cause block", cause);
    check(cause.includes(cfg.broken_message), "with the failed rank's message", cause);
    check(/rank\s*:?\s*1\b/.test(cause) || cause.includes("rank 1"), "naming rank 1", cause);
    await page.screenshot({ path: path.join(cfg.out, "dashboard-failed.png"), fullPage: true });

    // The finished run: its chart has a point per metrics record, and it renders.
    await page.click(`#runs tr[data-run="${cfg.done}"]`);
    await page.waitForSelector("#chart svg g.curve polyline", { timeout: 15000 });
    const pts = await page.$$eval("#chart svg g.curve", (gs) => gs.map((g) => ({
      metric: g.dataset.metric, series: g.dataset.series, attempt: g.dataset.attempt,
      n: [...g.querySelectorAll("polyline")].reduce((s, p) => s + p.getAttribute("points").trim().split(/\s+/).length, 0),
    })));
    const trainLoss = pts.find((p) => p.metric === "loss" && p.series === "train");
    check(trainLoss && trainLoss.n === cfg.done_train, `the finished run's loss curve has ${cfg.done_train} points, one per train record`, JSON.stringify(pts));
    const evalLoss = pts.find((p) => p.metric === "loss" && p.series === "eval");
    check(evalLoss && evalLoss.n === cfg.done_eval, `its eval curve has ${cfg.done_eval} points`, JSON.stringify(pts));
    // The SVG drawn as an image by the browser: the curves' colour is there.
    const pixels = await page.evaluate(async () => {
      const svg = document.querySelector("#chart svg");
      const xml = new XMLSerializer().serializeToString(svg);
      const img = new Image();
      img.src = "data:image/svg+xml;base64," + btoa(unescape(encodeURIComponent(xml)));
      await img.decode();
      const c = document.createElement("canvas");
      c.width = img.naturalWidth || 960;
      c.height = img.naturalHeight || 640;
      const g = c.getContext("2d");
      g.fillStyle = "#fff";
      g.fillRect(0, 0, c.width, c.height);
      g.drawImage(img, 0, 0);
      const d = g.getImageData(0, 0, c.width, c.height).data;
      let curve = 0, ink = 0;
      for (let i = 0; i < d.length; i += 4) {
        const [r, gg, b] = [d[i], d[i + 1], d[i + 2]];
        if (Math.abs(r - 0x1f) < 40 && Math.abs(gg - 0x77) < 40 && Math.abs(b - 0xb4) < 40) curve++;
        if (r < 200 || gg < 200 || b < 200) ink++;
      }
      return { curve, ink, w: c.width, h: c.height };
    });
    check(pixels.curve > 300, `the plot renders to an image with the curves visible (${pixels.curve} pixels of the first attempt's colour in ${pixels.w}x${pixels.h})`, JSON.stringify(pixels));
    const chart = await page.$("#chart");
    await chart.screenshot({ path: path.join(cfg.out, "plot.png") });
    const done = await page.textContent("#latest");
    check(/step \d+: loss/.test(done), "the latest train record is shown", done);

    // The running run: its log and its chart update while we watch.
    await page.click(`#runs tr[data-run="${cfg.live}"]`);
    await page.waitForFunction(() => /tick \d+/.test(document.querySelector("#log").textContent), null, { timeout: 15000 });
    const ticks = async () => Math.max(...[...(await page.textContent("#log")).matchAll(/tick (\d+)/g)].map((m) => +m[1]));
    const first = await ticks();
    const log0 = await page.textContent("#log");
    check(!log0.includes(cfg.big_marker), "a megabytes-long log is shown from its tail, not read whole", log0.slice(0, 200));
    await page.waitForFunction((n) => {
      const m = [...document.querySelector("#log").textContent.matchAll(/tick (\d+)/g)];
      return m.length && Math.max(...m.map((x) => +x[1])) >= n + 3;
    }, first, { timeout: 20000 });
    check((await ticks()) >= first + 3, `the log grows while the test watches (tick ${first} -> ${await ticks()})`);
    await page.waitForSelector("#chart svg", { timeout: 15000 });
    const before = +(await page.getAttribute("#chart", "data-records"));
    let step = cfg.live_steps;
    for (let i = 0; i < 5; i++) fs.appendFileSync(cfg.live_metrics, record(++step));
    await page.waitForFunction((n) => +document.querySelector("#chart").dataset.records >= n + 5, before, { timeout: 20000 });
    const after = +(await page.getAttribute("#chart", "data-records"));
    check(after === before + 5, `the chart takes the new records as they arrive (${before} -> ${after})`);
    const livePts = await page.$$eval("#chart svg g.curve[data-metric=loss][data-series=train] polyline", (ps) =>
      ps.reduce((s, p) => s + p.getAttribute("points").trim().split(/\s+/).length, 0));
    check(livePts === after, `the running run's loss curve has a point per record (${livePts})`);
    await page.click('button[data-stream="stderr"]');
    await page.waitForFunction(() => document.querySelector("#log").textContent.includes("to stderr"), null, { timeout: 15000 });
    check(true, "another stream of the rank can be tailed (stderr)");
    await page.screenshot({ path: path.join(cfg.out, "dashboard.png"), fullPage: true });

    // The Python run's stacks, taken by mglaunch dump: a button by its rank.
    await page.click(`#runs tr[data-run="${cfg.py}"]`);
    await page.waitForSelector(`button[data-stream="${cfg.py_dump}"]`, { timeout: 15000 });
    const label = await page.textContent(`button[data-stream="${cfg.py_dump}"]`);
    check(/^dump \d/.test(label), `the rank's dump has a button by its time (${label})`, label);
    await page.click(`button[data-stream="${cfg.py_dump}"]`);
    await page.waitForFunction((f) => document.querySelector("#log").textContent.includes(f), cfg.py_frame, { timeout: 15000 });
    const st = await page.textContent("#log");
    check(st.includes("# Python threads, by faulthandler:") && / in spin\n/.test(st) && st.includes("in sleeper"),
      "it shows the Python traceback of every thread", st.slice(0, 400));
    check(/\n#0 +0x[0-9a-f]+ /.test(st), "and the native stacks", st.slice(0, 400));
    await page.screenshot({ path: path.join(cfg.out, "dashboard-stacks.png"), fullPage: true });
  } finally {
    check(errors.length === 0, "the page ran without a script error", errors.join("\n"));
    check(elsewhere.length === 0, "the page asked nothing of any other origin (no CDN)", elsewhere.join("\n"));
    await ctx.close();
  }
}

main().then(() => process.exit(failed ? 1 : 0), (e) => {
  console.log("not ok - the browser session went through");
  console.log("#   " + String(e && e.stack || e).split("\n").join("\n#   "));
  process.exit(1);
});
