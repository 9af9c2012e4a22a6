// An S3 server on loopback for tests/integration/train_upload.t:
// @20minutes/s3rver used as a library (it has no command of its own), which
// checks AWS Signature V4 signatures (a wrong secret gets 403
// SignatureDoesNotMatch). Its one account is key S3RVER, secret S3RVER.
//   node s3server.js PORT DIRECTORY BUCKET...
// Prints "listening PORT" once it listens; stops on SIGTERM or SIGINT.
"use strict";
const S3rver = require("@20minutes/s3rver");

const [port, directory, ...buckets] = process.argv.slice(2);
const server = new S3rver({
  address: "127.0.0.1",
  port: +port,
  directory,
  silent: true,
  vhostBuckets: false,
  configureBuckets: buckets.map((name) => ({ name })),
});
server.run().then((addr) => console.log("listening " + addr.port), (e) => {
  console.error("s3server: " + e.message);
  process.exit(1);
});
for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => server.close().then(() => process.exit(0), () => process.exit(0)));
