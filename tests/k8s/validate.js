// Checks Kubernetes manifests offline, so that a misspelt field, a wrong type or
// a value outside an enum fails a test instead of a `kubectl apply`.
//
//   node tests/k8s/validate.js FILE... ('-' reads standard input)
//
// Kubernetes' own kinds are checked with the schemas of npm's kubernetes-models
// (Kubernetes 1.30). Its validators check types and enums but accept any
// unknown field, so each object is handed to them behind a Proxy that records
// which properties they read: a validator reads every property its schema
// names, and enumerates the keys of a map, so a key that was never read is a
// field Kubernetes does not know. The operators' kinds are checked against
// their CRDs' openAPIV3Schema (tests/k8s/crds/), objects closed as the API
// server prunes them, unless the schema preserves unknown fields. Prints one
// line per problem ("FILE: Kind/name: /json/path: what") and exits 1 if any.
"use strict";

const fs = require("fs");
const path = require("path");
const yaml = require("js-yaml");
const Ajv = require("ajv");

const CRD_DIR = path.join(__dirname, "crds");

// apiVersion group -> the word kubernetes-models uses in its schema names.
const CORE_GROUPS = {
  "": "Core",
  apps: "Apps",
  batch: "Batch",
  policy: "Policy",
  "networking.k8s.io": "Networking",
  "rbac.authorization.k8s.io": "Rbac",
  "scheduling.k8s.io": "Scheduling",
  "autoscaling": "Autoscaling",
};

// The packages export their models, not the validators behind them: load
// those by path (an absolute path is not subject to "exports").
function schemaFile(pkg, name) {
  const main = require.resolve(pkg);
  let dir = path.dirname(main);
  while (!fs.existsSync(path.join(dir, "_schemas"))) dir = path.dirname(dir);
  return path.join(dir, "_schemas", `${name}.js`);
}

function coreValidator(group, version, kind) {
  const word = CORE_GROUPS[group];
  if (word === undefined) return null;
  const name = `IoK8sApi${word}${version[0].toUpperCase()}${version.slice(1)}${kind}`;
  try {
    return require(schemaFile("kubernetes-models", name)).validate;
  } catch (e) {
    return null;
  }
}

const objectMeta = require(schemaFile("@kubernetes-models/apimachinery", "IoK8sApimachineryPkgApisMetaV1ObjectMeta")).validate;

// Runs a kubernetes-models validator on a tracked copy of `value`; returns
// the schema errors and the fields no schema named.
function validateTracked(validate, value, base) {
  const records = [];
  const wrap = (v, p) => {
    if (v === null || typeof v !== "object") return v;
    const rec = { path: p, obj: v, read: new Set(), enumerated: false, children: new Map() };
    records.push(rec);
    return new Proxy(v, {
      get(t, k, r) {
        const got = Reflect.get(t, k, r);
        if (typeof k !== "string" || !Object.prototype.hasOwnProperty.call(t, k)) {
          if (typeof k === "string") rec.read.add(k);
          return got;
        }
        rec.read.add(k);
        if (!rec.children.has(k)) rec.children.set(k, wrap(got, `${p}/${k}`));
        return rec.children.get(k);
      },
      ownKeys(t) {
        rec.enumerated = true;
        return Reflect.ownKeys(t);
      },
    });
  };
  const ok = validate(wrap(value, base));
  const problems = [];
  if (!ok)
    for (const e of validate.errors || [])
      problems.push(`${e.instancePath ? base + e.instancePath : base || "/"}: ${e.keyword} ${JSON.stringify(e.params)}`);
  for (const rec of records) {
    if (Array.isArray(rec.obj) || rec.enumerated) continue;
    for (const k of Object.keys(rec.obj))
      if (!rec.read.has(k)) problems.push(`${rec.path}/${k}: unknown field`);
  }
  return problems;
}

// OpenAPI v3 (as Kubernetes uses it) to JSON Schema for ajv: objects with
// properties are closed unless x-kubernetes-preserve-unknown-fields says not.
function closeSchema(s) {
  if (Array.isArray(s)) return s.map(closeSchema);
  if (s === null || typeof s !== "object") return s;
  const out = {};
  for (const [k, v] of Object.entries(s)) {
    if (k.startsWith("x-kubernetes-") || k === "format" || k === "nullable") continue;
    if (k === "properties") {
      out.properties = {};
      for (const [pk, pv] of Object.entries(v)) out.properties[pk] = closeSchema(pv);
    } else {
      out[k] = closeSchema(v);
    }
  }
  if (s.nullable && out.type) out.type = [out.type, "null"];
  if (s.properties && s.additionalProperties === undefined && !s["x-kubernetes-preserve-unknown-fields"])
    out.additionalProperties = false;
  return out;
}

const ajv = new Ajv({ strict: false, allErrors: true, validateFormats: false });
const crds = new Map();
for (const f of fs.readdirSync(CRD_DIR).filter((f) => f.endsWith(".json"))) {
  const crd = JSON.parse(fs.readFileSync(path.join(CRD_DIR, f), "utf8"));
  for (const [version, schema] of Object.entries(crd.versions)) {
    const closed = closeSchema(schema);
    delete closed.properties.metadata; // checked as an ObjectMeta below
    crds.set(`${crd.group}/${version}/${crd.kind}`, { closed, validate: null });
  }
}

function crdValidator(group, version, kind) {
  const c = crds.get(`${group}/${version}/${kind}`);
  if (!c) return null;
  if (!c.validate) c.validate = ajv.compile(c.closed);
  return c.validate;
}

function checkObject(doc) {
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) return ["not an object"];
  if (typeof doc.apiVersion !== "string" || typeof doc.kind !== "string") return ["no apiVersion or kind"];
  const slash = doc.apiVersion.lastIndexOf("/");
  const group = slash < 0 ? "" : doc.apiVersion.slice(0, slash);
  const version = doc.apiVersion.slice(slash + 1);
  const core = coreValidator(group, version, doc.kind);
  if (core) return validateTracked(core, doc, "");
  const crd = crdValidator(group, version, doc.kind);
  if (!crd) return [`no schema for ${doc.apiVersion} ${doc.kind} (tests/k8s/crds/ has none)`];
  const problems = [];
  const { metadata, ...rest } = doc;
  if (metadata !== undefined) problems.push(...validateTracked(objectMeta, metadata, "/metadata"));
  if (!crd(rest))
    for (const e of crd.errors) {
      const extra = e.keyword === "additionalProperties" ? `/${e.params.additionalProperty}: unknown field` : "";
      problems.push(extra ? `${e.instancePath}${extra}` : `${e.instancePath || "/"}: ${e.keyword} ${JSON.stringify(e.params)}`);
    }
  return problems;
}

let bad = 0;
const files = process.argv.slice(2);
if (files.length === 0) {
  process.stderr.write("usage: validate.js FILE... ('-' for standard input)\n");
  process.exit(2);
}
for (const file of files) {
  let docs;
  try {
    const text = fs.readFileSync(file === "-" ? 0 : file, "utf8");
    docs = yaml.loadAll(text).filter((d) => d !== null && d !== undefined);
  } catch (e) {
    console.log(`${file}: ${e.message.split("\n")[0]}`);
    bad++;
    continue;
  }
  for (const doc of docs) {
    const name = `${doc && doc.kind}/${doc && doc.metadata && doc.metadata.name}`;
    const problems = checkObject(doc);
    for (const p of problems) console.log(`${file}: ${name}: ${p}`);
    if (problems.length) bad++;
    else console.log(`${file}: ${name}: ok`);
  }
}
process.exit(bad ? 1 : 0);
