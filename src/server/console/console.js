// The support console of pglimit: one page, one section shown at a time
// (by the address's #fragment), each calling the admin API with the token
// typed at the top. The token lives in `token` below and nowhere else: not
// in a cookie (no other site can ride on it), not in storage (nothing is
// left behind when the tab closes, nor readable by a later visitor).
"use strict";
(() => {
  let token = null;
  let policies = [];
  let auditCursor = null;
  const $ = (id) => document.getElementById(id);
  const SECTIONS = ["overview", "lookup", "top", "blocks", "overrides", "audit"];

  // --- Calls: every one with the bearer token, problems thrown as they came.
  async function call(method, path, body) {
    if (!token) throw { title: "No token", detail: "Type an admin token at the top of the page first." };
    const init = { method, headers: { Authorization: "Bearer " + token }, cache: "no-store", credentials: "omit" };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (e) {
      throw { title: "No answer", detail: "pglimit did not answer (" + e.message + ")" };
    }
    const text = await response.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = { detail: text }; }
    if (response.ok) return data;
    throw Object.assign({ status: response.status, title: response.statusText }, data || {});
  }

  // A route answering 404 for itself (the router's "no resource at"): a
  // server without it yet.
  function missing(p, route) {
    if (p.status === 404 && String(p.detail || "").startsWith("no resource at")) {
      return Object.assign({}, p, { title: "Not on this server",
        detail: route + " answers 404: this pglimit does not have it yet (a newer version does)." });
    }
    return p;
  }

  function showProblem(id, p) {
    const el = $(id);
    if (!p) { el.hidden = true; el.textContent = ""; return; }
    const status = p.status ? " (" + p.status + ")" : "";
    const field = p.field ? " [field: " + p.field + "]" : "";
    el.textContent = (p.title || "Error") + status + ": " + (p.detail || "no detail") + field;
    el.hidden = false;
  }

  // Runs `work`, showing what it throws in the problem box `problemId`.
  async function guarded(problemId, work) {
    showProblem(problemId, null);
    try { await work(); } catch (p) { showProblem(problemId, p && p.title ? p : { title: "Error", detail: String(p) }); }
  }

  // --- Rendering: generic tables, so that unknown fields still show.
  function text(value) {
    if (value === null || value === undefined) return "—";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  function el(tag, content, className) {
    const node = document.createElement(tag);
    if (content !== undefined && content !== null) {
      if (content instanceof Node) node.append(content); else node.textContent = content;
    }
    if (className) node.className = className;
    return node;
  }

  // A table of `rows` (objects): `columns` first, then any other field seen;
  // `cells` may render a column itself; `extra` adds a last cell per row,
  // under the heading "do".
  function table(caption, rows, columns, cells, extra) {
    if (!rows || rows.length === 0) return el("p", "None.", "empty");
    const seen = new Set(columns || []);
    rows.forEach((r) => Object.keys(r).forEach((k) => seen.add(k)));
    const names = [...seen];
    const t = el("table");
    t.append(el("caption", caption));
    const head = el("tr");
    names.forEach((n) => { const th = el("th", n); th.scope = "col"; head.append(th); });
    if (extra) head.append(el("th", "do"));
    t.append(el("thead", head));
    const body = el("tbody");
    rows.forEach((r) => {
      const tr = el("tr");
      names.forEach((n) => tr.append(el("td", cells && cells[n] ? cells[n](r[n], r) : text(r[n]))));
      if (extra) tr.append(el("td", extra(r)));
      body.append(tr);
    });
    t.append(body);
    return t;
  }

  function put(id, node) { $(id).replaceChildren(node); }
  const pairs = (o) => (o ? Object.entries(o).map(([k, v]) => k + "=" + v).join(", ") : "—");

  // --- Token.
  async function useToken(event) {
    event.preventDefault();
    token = $("token").value.trim();
    $("token").value = "";
    try {
      await call("GET", "/admin/overview");
    } catch (p) {
      token = null;
      const why = p.status === 401 || p.status === 403 ? "The token was refused: " : "Cannot sign in: ";
      $("who").textContent = why + (p.detail || p.title);
      $("who").className = "refused";
      return;
    }
    $("who").textContent = "Using an admin token, kept in this page's memory only.";
    $("who").className = "ok";
    $("token-forget").hidden = false;
    show(location.hash.slice(1));
  }

  function forgetToken() {
    token = null;
    $("who").textContent = "Token forgotten. Type an admin token to go on.";
    $("who").className = "";
    $("token-forget").hidden = true;
    $("token").focus();
  }

  // --- Sections.
  function show(name, focus) {
    if (!SECTIONS.includes(name)) name = "overview";
    SECTIONS.forEach((s) => { $(s).hidden = s !== name; });
    document.querySelectorAll("nav a").forEach((a) => {
      if (a.getAttribute("href") === "#" + name) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    });
    if (focus) { const h = $(name + "-title"); h.tabIndex = -1; h.focus(); }
    if (!token) return;
    const load = { overview: loadOverview, blocks: loadBlocks, overrides: loadOverrides, top: loadTop,
      audit: () => loadAudit(null), lookup: () => policies.length || loadOverview() };
    load[name]();
  }

  // --- Overview.
  function loadOverview() {
    return guarded("overview-problem", async () => {
      const o = await call("GET", "/admin/overview");
      const facts = $("overview-store");
      facts.replaceChildren();
      const store = o.store || {};
      [["Store", store.kind], ["Degraded", store.degraded ? "yes: answering from memory" : "no"],
        ["Instances", store.instances]].forEach(([k, v]) => facts.append(el("dt", k), el("dd", text(v))));
      const minutes = o.minutes || [];
      const most = Math.max(1, ...minutes.map((m) => m.checks || 0));
      put("overview-minutes", table("Checks and denials per minute (UTC), oldest first", minutes,
        ["minute", "checks", "denied"], { checks: (v) => meter(v, most), minute: clock }));
      const rows = [];
      (o.policies || []).forEach((p) => (p.buckets || []).forEach((b) =>
        rows.push(Object.assign({ policy: p.name, shadow: p.shadow }, b))));
      put("overview-policies", table("Buckets of each policy", rows,
        ["policy", "shadow", "name", "algorithm", "limit", "window", "identifiers"],
        { identifiers: (v) => (v || []).join(", ") }));
      setPolicies(o.policies || []);
    });
  }

  // A minute as its hour and minute (UTC), the whole time kept for machines.
  function clock(value) {
    const t = el("time", String(value || "").slice(11, 16));
    t.dateTime = value || "";
    return t;
  }

  function meter(value, most) {
    const wrap = el("span", null, "count");
    const m = el("meter");
    m.min = 0; m.max = most; m.value = value || 0;
    m.setAttribute("aria-label", text(value) + " checks");
    wrap.append(el("span", text(value)), m);
    return wrap;
  }

  function identifiersOf(policy) {
    const names = [];
    (policy.buckets || []).forEach((b) => (b.identifiers || []).forEach((i) => names.includes(i) || names.push(i)));
    return names;
  }

  function setPolicies(list) {
    policies = list;
    ["lookup-policy", "override-policy"].forEach((id) => {
      const select = $(id);
      const chosen = select.value;
      select.replaceChildren(...list.map((p) => el("option", p.name)));
      if (list.some((p) => p.name === chosen)) select.value = chosen;
    });
    fields("lookup-identifiers", "lookup-id-", identifiersOf(chosenPolicy("lookup-policy")), "");
    overrideFields();
  }

  const chosenPolicy = (id) => policies.find((p) => p.name === $(id).value) || { buckets: [] };

  // Labelled inputs, one per name; values typed before are kept.
  function fields(container, prefix, names, placeholder) {
    const old = {};
    $(container).querySelectorAll("input").forEach((i) => { old[i.id] = i.value; });
    $(container).replaceChildren(...names.map((n) => {
      const input = el("input");
      input.id = prefix + n; input.name = n; input.value = old[input.id] || ""; input.placeholder = placeholder;
      const label = el("label", n); label.htmlFor = input.id;
      const field = el("div", null, "field");
      field.append(label, input);
      return field;
    }));
  }

  function overrideFields() {
    const policy = chosenPolicy("override-policy");
    fields("override-when-fields", "override-when-", identifiersOf(policy), "any");
    fields("override-limits-fields", "override-limit-", (policy.buckets || []).map((b) => b.name), "as the policy");
    document.querySelectorAll("#override-limits-fields input").forEach((i) => {
      i.type = "number"; i.min = 1; i.inputMode = "numeric";
    });
  }

  // --- Look up, and act.
  function lookupBody() {
    if (document.querySelector("input[name=lookup-kind]:checked").value === "key") {
      return { key: $("lookup-key").value, limit: Number($("lookup-limit").value), window: $("lookup-window").value };
    }
    const identifiers = {};
    $("lookup-identifiers").querySelectorAll("input").forEach((i) => { identifiers[i.name] = i.value; });
    return { policy: $("lookup-policy").value, identifiers };
  }

  function explain(event) {
    if (event) event.preventDefault();
    return guarded("lookup-problem", async () => {
      let answer;
      try { answer = await call("POST", "/admin/explain", lookupBody()); } catch (p) { throw missing(p, "POST /admin/explain"); }
      const verdict = el("p", (answer.allowed ? "Allowed" : "Denied") + " (" + text(answer.reason) + "): " + text(answer.why),
        answer.allowed ? "verdict allowed" : "verdict denied");
      const facts = el("dl", null, "facts");
      ["policy", "cost", "rule", "store", "degraded", "checked_at"].forEach((k) => facts.append(el("dt", k), el("dd", text(answer[k]))));
      const buckets = table("Buckets of this identity", answer.buckets || [],
        ["name", "allowed", "remaining", "limit", "window_s", "reset_at", "retry_after_s", "block", "denials", "key"],
        { block: (b) => (b ? b.kind + " until " + b.until + (b.reason ? " (" + b.reason + ")" : "") : "—"),
          denials: (d) => (d ? d.count + ", last " + d.last : "—") });
      const scroll = el("div", buckets, "scroll");
      $("lookup-result").replaceChildren(verdict, facts, scroll);
    });
  }

  function actBody(block) {
    const body = lookupBody();
    const bucket = $("act-bucket").value.trim();
    if (block === "reset") return bucket ? Object.assign(body, { buckets: [bucket] }) : body;
    if (!body.policy) throw { title: "Not for an ad hoc key", detail: "blocks name a policy: choose one above" };
    if (bucket) body.bucket = bucket;
    if (block === "block") {
      body.for = $("act-for").value.trim();
      if ($("act-reason").value.trim()) body.reason = $("act-reason").value.trim();
    }
    return body;
  }

  function act(kind) {
    return guarded("act-problem", async () => {
      $("act-done").textContent = "";
      const targets = (list) => (list || []).map((t) => t.policy + "/" + t.bucket).join(", ");
      let done;
      if (kind === "reset") {
        await call("POST", "/reset", actBody("reset")).catch((p) => { if (p.status !== 429) throw p; });
        done = "Reset: the counters of this identity start afresh.";
      } else if (kind === "block") {
        const r = await call("POST", "/admin/blocks", actBody("block"));
        done = "Blocked " + targets(r.blocked) + " until " + r.until + ".";
      } else {
        const r = await call("DELETE", "/admin/blocks", actBody("unblock"));
        done = "Unblocked " + targets(r.unblocked) + " (" + text(r.lifted) + " lifted).";
      }
      $("act-done").textContent = done;
      if ($("lookup-result").childElementCount) await explain();
    });
  }

  // --- Top denied.
  function loadTop(event) {
    if (event) event.preventDefault();
    return guarded("top-problem", async () => {
      const q = new URLSearchParams();
      ["since", "policy", "bucket", "limit"].forEach((k) => { const v = $("top-" + k).value.trim(); if (v) q.set(k, v); });
      let r;
      try { r = await call("GET", "/admin/top?" + q); } catch (p) { throw missing(p, "GET /admin/top"); }
      put("top-result", table("Most denied keys from " + text(r.since) + " to " + text(r.until), r.keys,
        ["policy", "bucket", "shown", "denials", "first", "last", "key"], { shown: pairs },
        (row) => (row.shown ? button("Look up", "Look up " + pairs(row.shown), () => lookUp(row)) : "")));
    });
  }

  function button(label, name, onClick) {
    const b = el("button", label);
    b.type = "button";
    b.setAttribute("aria-label", name);
    b.addEventListener("click", onClick);
    return b;
  }

  function lookUp(row) {
    $("lookup-policy").value = row.policy;
    setPolicies(policies);
    Object.entries(row.shown).forEach(([k, v]) => { const i = $("lookup-id-" + k); if (i) i.value = v; });
    location.hash = "#lookup";
  }

  // --- Blocks.
  function loadBlocks() {
    return guarded("blocks-problem", async () => {
      const r = await call("GET", "/admin/blocks");
      put("blocks-result", table("Blocks in force", r.blocks, ["policy", "bucket", "kind", "until", "reason", "created_at", "key"]));
    });
  }

  // --- Overrides.
  function loadOverrides() {
    return guarded("overrides-problem", async () => {
      const r = await call("GET", "/admin/overrides");
      put("overrides-result", table("Overrides set through the API", (r.overrides || []).map(withAction),
        ["policy", "when", "action", "until", "note", "id", "created_at"], { when: pairs },
        (row) => button("Remove", "Remove override " + row.id, () => removeOverride(row.id))));
    });
  }

  // An override's action in one column: its limits, "unlimited" or "deny".
  function withAction(o) {
    const { limits, unlimited, deny, ...rest } = o;
    const action = limits ? "limits: " + pairs(limits) : unlimited ? "unlimited" : deny ? "deny" : "—";
    return Object.assign({ action }, rest);
  }

  function removeOverride(id) {
    return guarded("overrides-problem", async () => {
      await call("DELETE", "/admin/overrides/" + encodeURIComponent(id));
      $("override-done").textContent = "Removed override " + id + ".";
      await loadOverrides();
    });
  }

  function overrideBody() {
    const body = { policy: $("override-policy").value, when: {} };
    $("override-when-fields").querySelectorAll("input").forEach((i) => { if (i.value.trim()) body.when[i.name] = i.value.trim(); });
    const action = document.querySelector("input[name=override-action]:checked").value;
    if (action === "limits") {
      body.limits = {};
      $("override-limits-fields").querySelectorAll("input").forEach((i) => { if (i.value) body.limits[i.name] = Number(i.value); });
    } else {
      body[action] = true;
    }
    if ($("override-until").value) body.until = new Date($("override-until").value).toISOString();
    if ($("override-note").value.trim()) body.note = $("override-note").value.trim();
    return body;
  }

  function addOverride(event) {
    event.preventDefault();
    return guarded("override-problem", async () => {
      $("override-done").textContent = "";
      const r = await call("POST", "/admin/overrides", overrideBody());
      $("override-done").textContent = "Added override " + r.id + (r.until ? ", until " + r.until : "") + ".";
      await loadOverrides();
    });
  }

  // --- Audit.
  function loadAudit(cursor, event) {
    if (event) event.preventDefault();
    return guarded("audit-problem", async () => {
      const q = new URLSearchParams();
      ["action", "target", "limit"].forEach((k) => { const v = $("audit-" + k).value.trim(); if (v) q.set(k, v); });
      if (cursor) q.set("cursor", cursor);
      let r;
      try { r = await call("GET", "/admin/audit?" + q); } catch (p) { throw missing(p, "GET /admin/audit"); }
      auditCursor = r.next || null;
      $("audit-next").hidden = !auditCursor;
      put("audit-result", table("Audit entries, newest first", r.entries,
        ["at", "actor", "action", "target", "detail", "request_id", "id"]));
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("token-form").addEventListener("submit", useToken);
    $("token-forget").addEventListener("click", forgetToken);
    // Only a section's name switches sections ("#main", the skip link's, does not).
    window.addEventListener("hashchange", () => {
      const name = location.hash.slice(1);
      if (SECTIONS.includes(name)) show(name, true);
    });
    $("overview-refresh").addEventListener("click", loadOverview);
    $("lookup-form").addEventListener("submit", explain);
    $("lookup-policy").addEventListener("change", () => setPolicies(policies));
    document.querySelectorAll("input[name=lookup-kind]").forEach((r) => r.addEventListener("change", () => {
      const key = r.value === "key" && r.checked;
      $("lookup-key-fields").hidden = !key;
      $("lookup-policy-fields").hidden = key;
    }));
    ["reset", "block", "unblock"].forEach((k) => $("act-" + k).addEventListener("click", () => act(k)));
    $("top-form").addEventListener("submit", loadTop);
    $("blocks-refresh").addEventListener("click", loadBlocks);
    $("overrides-refresh").addEventListener("click", loadOverrides);
    $("override-policy").addEventListener("change", overrideFields);
    document.querySelectorAll("input[name=override-action]").forEach((r) => r.addEventListener("change", () => {
      $("override-limits").hidden = document.querySelector("input[name=override-action]:checked").value !== "limits";
    }));
    $("override-form").addEventListener("submit", addOverride);
    $("audit-form").addEventListener("submit", (e) => loadAudit(null, e));
    $("audit-next").addEventListener("click", () => loadAudit(auditCursor));
    show(location.hash.slice(1));
  });
})();
