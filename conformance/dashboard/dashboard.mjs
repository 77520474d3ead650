// The official operator dashboard against a running server, in headless Chromium.
//
// Seeds tenants, keys, budgets and a reservation through the API, then drives the dashboard
// the way an operator does: a refused login, a login, then Overview, Tenants (create, suspend,
// reactivate), a tenant's page, API keys (create, rename, revoke), Budgets and Reservations
// (force release), asserting what each page shows and checking the server's state after each
// action. Every response of 400 or more that the test did not provoke, every failed request
// and every console error fails the run, except the calls in KNOWN_GAPS: endpoints the
// dashboard uses that the server does not implement yet. One screenshot per page.
//
// Environment:
//   CYCLES_URL             the server, serving the dashboard at / (required)
//   CYCLES_ADMIN_KEY       its admin key (required)
//   CYCLES_SCREENSHOT_DIR  where the screenshots go (required)
//   CHROMIUM               the browser (default: /usr/bin/chromium)

import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const BASE = required('CYCLES_URL').replace(/\/$/, '');
const ADMIN_KEY = required('CYCLES_ADMIN_KEY');
const SCREENSHOTS = required('CYCLES_SCREENSHOT_DIR');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const UNIT = 'USD_MICROCENTS';
const TIMEOUT_MS = 15_000;

// Calls the dashboard makes that the server does not answer yet. A response of 400 or more
// to one of them is reported as a known gap, not a failure; everything else must succeed.
// `when`, if given, narrows an entry to the queries it names. Remove an entry when the server
// catches up.
const KNOWN_GAPS = [
  // Overview's "recent operator activity" card and the Audit page.
  { method: 'GET', path: '/v1/admin/audit/logs', why: 'the audit log is not built' },
  // Overview's failing-webhooks card, the Webhooks pages, and the tenant page, which loads
  // the tenant's webhooks with everything else and shows "Tenant not found" when that fails.
  { method: 'GET', path: '/v1/admin/webhooks', why: 'webhooks are not built' },
  { method: '*', path: '/v1/admin/webhooks/{any}', why: 'webhooks are not built' },
  { method: '*', path: '/v1/admin/config/webhook-security', why: 'webhooks are not built' },
  // The Events page and a budget's event timeline.
  { method: 'GET', path: '/v1/admin/events', why: 'events are not built' },
  { method: 'GET', path: '/v1/admin/events/{any}', why: 'events are not built' },
].map((gap) => {
  const path = gap.path.replace(/\{any\}/g, '[^/]+(/.*)?');
  return { ...gap, pattern: new RegExp(`^${path}$`) };
});

// Console errors of the dashboard itself, not of the server: each is matched exactly and
// reported, not failed.
const DASHBOARD_CONSOLE_ISSUES = [
  // The create-tenant form's `pattern` attribute is not a valid `v`-flag regular expression
  // (an unescaped `-` in a class), which current Chromium compiles it as; the browser then
  // ignores the attribute, and the form checks the id itself.
  'Pattern attribute value ^[a-z0-9-]+$ is not a valid regular expression: Uncaught ' +
    'SyntaxError: Invalid regular expression: /^[a-z0-9-]+$/v: Invalid character class',
];

function required(name) {
  const value = process.env[name];
  if (!value) {
    console.error(`dashboard test: ${name} must be set`);
    process.exit(2);
  }
  return value;
}

function knownGap(method, url) {
  return KNOWN_GAPS.find(
    (g) =>
      (g.method === '*' || g.method === method) &&
      g.pattern.test(url.pathname) &&
      (!g.when || g.when(url.searchParams)),
  );
}

// ---------------------------------------------------------------------------------------
// The API, for seeding and for checking what the UI did
// ---------------------------------------------------------------------------------------

async function api(method, path, { body, key } = {}) {
  const headers = key ? { 'X-Cycles-API-Key': key } : { 'X-Admin-API-Key': ADMIN_KEY };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const response = await fetch(BASE + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    // Left null: the caller's status check reports the body.
  }
  if (!response.ok) {
    throw new Error(`${method} ${path} answered ${response.status}: ${text}`);
  }
  return json;
}

async function seed() {
  for (const [id, name] of [
    ['acme', 'Acme Corp'],
    ['globex', 'Globex Industries'],
    ['initech', 'Initech'],
  ]) {
    await api('POST', '/v1/admin/tenants', { body: { tenant_id: id, name } });
  }
  const budgets = [
    ['acme', 'tenant:acme', 5_000_000],
    ['acme', 'tenant:acme/workspace:prod', 2_000_000],
    ['globex', 'tenant:globex', 9_000_000],
  ];
  for (const [tenant, scope, amount] of budgets) {
    await api('POST', '/v1/admin/budgets', {
      body: { tenant_id: tenant, scope, unit: UNIT, allocated: { unit: UNIT, amount } },
    });
  }
  const acmeKey = (await api('POST', '/v1/admin/api-keys', {
    body: { tenant_id: 'acme', name: 'acme-agent' },
  })).key_secret;
  await api('POST', '/v1/admin/api-keys', { body: { tenant_id: 'globex', name: 'globex-agent' } });
  const reservation = await api('POST', '/v1/reservations', {
    key: acmeKey,
    body: {
      idempotency_key: `dashboard-seed-${Date.now()}`,
      subject: { tenant: 'acme', workspace: 'prod' },
      action: { kind: 'llm.completion', name: 'gpt-4o-mini' },
      estimate: { unit: UNIT, amount: 125_000 },
      ttl_ms: 3_600_000,
    },
  });
  return { budgets, reservationId: reservation.reservation_id };
}

// ---------------------------------------------------------------------------------------
// What the browser saw
// ---------------------------------------------------------------------------------------

const problems = [];
const gapsHit = new Map();
// Pages a known gap keeps from rendering, as notes for the report.
const blocked = [];
const dashboardIssues = new Set();
// Failures the test provokes on purpose, as (method, path, status), each allowed once.
const provoked = [];

function expectFailure(method, path, status) {
  provoked.push({ method, path, status });
}

function watch(page) {
  page.on('response', (response) => {
    const status = response.status();
    if (status < 400) return;
    const method = response.request().method();
    const url = new URL(response.url());
    const path = url.pathname;
    const at = provoked.findIndex(
      (p) => p.method === method && p.path === path && p.status === status,
    );
    if (at >= 0) {
      provoked.splice(at, 1);
      return;
    }
    const gap = url.origin === BASE ? knownGap(method, url) : undefined;
    if (gap) {
      const seen = `${method} ${gap.path} → ${status}: ${gap.why}`;
      gapsHit.set(seen, (gapsHit.get(seen) || 0) + 1);
      return;
    }
    problems.push(`${method} ${url.pathname}${url.search} answered ${status}`);
  });
  page.on('requestfailed', (request) => {
    // A navigation cancels the page's requests in flight (the polls): not a failure.
    const error = request.failure()?.errorText || 'failed';
    if (error !== 'net::ERR_ABORTED') {
      problems.push(`${request.method()} ${request.url()} failed: ${error}`);
    }
  });
  page.on('console', (message) => {
    if (message.type() !== 'error') return;
    // The browser logs every failed load; those are judged by their response above.
    if (message.text().startsWith('Failed to load resource')) return;
    if (DASHBOARD_CONSOLE_ISSUES.includes(message.text())) {
      dashboardIssues.add(message.text());
      return;
    }
    problems.push(`console error: ${message.text()}`);
  });
  page.on('pageerror', (error) => problems.push(`uncaught page error: ${error.message}`));
}

// ---------------------------------------------------------------------------------------
// Steps
// ---------------------------------------------------------------------------------------

let page;
let shots = 0;

async function step(name, run) {
  try {
    await run();
    console.log(`ok - ${name}`);
  } catch (error) {
    console.log(`not ok - ${name}`);
    await page?.screenshot({ path: join(SCREENSHOTS, `failed-${slug(name)}.png`), fullPage: true })
      .catch(() => {});
    throw error;
  }
}

function slug(text) {
  return text.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '');
}

async function screenshot(name) {
  shots += 1;
  const file = `${String(shots).padStart(2, '0')}-${name}.png`;
  await page.screenshot({ path: join(SCREENSHOTS, file), fullPage: true });
}

/** Waits until `text` is visible on the page (or inside `within`). */
async function sees(text, within = page) {
  await within.getByText(text, { exact: typeof text === 'string' }).first().waitFor();
}

async function heading(title) {
  await page.getByRole('heading', { level: 1, name: title, exact: true }).waitFor();
}

async function navigate(link, title) {
  await page.getByRole('link', { name: link, exact: true }).first().click();
  await heading(title);
}

/** Opens a row's actions menu and picks `item`. */
async function rowAction(menuLabel, item) {
  await page.getByRole('button', { name: menuLabel, exact: true }).click();
  await page.getByRole('menuitem', { name: item, exact: true }).click();
}

function dialog(title) {
  return page.getByRole('dialog', { name: title, exact: true });
}

/** Polls `check` (an API read) until it returns true. */
async function eventually(what, check) {
  const deadline = Date.now() + TIMEOUT_MS;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

async function tenantStatus(id) {
  return (await api('GET', `/v1/admin/tenants/${id}`)).status;
}

async function run() {
  const { budgets, reservationId } = await seed();
  console.log(`seeded 3 tenants, ${budgets.length} budgets, 2 keys, reservation ${reservationId}`);

  await step('a wrong admin key is refused and the login page stays', async () => {
    await page.goto('/login');
    await sees('Cycles Admin');
    expectFailure('GET', '/v1/auth/introspect', 401);
    await page.locator('#admin-api-key').fill('not-the-admin-key');
    await page.getByRole('button', { name: 'Login', exact: true }).click();
    await sees('Invalid admin key');
    if (new URL(page.url()).pathname !== '/login') {
      throw new Error(`left the login page: ${page.url()}`);
    }
    await screenshot('login-refused');
  });

  await step('the admin key logs in and opens the overview', async () => {
    await page.locator('#admin-api-key').fill(ADMIN_KEY);
    await page.getByRole('button', { name: 'Login', exact: true }).click();
    await heading('Overview');
    await sees('What needs attention');
    await screenshot('overview');
  });

  await step('tenants: the seeded tenants are listed', async () => {
    await navigate('Tenants', 'Tenants');
    for (const name of ['Acme Corp', 'Globex Industries', 'Initech']) await sees(name);
    await sees('acme');
    await screenshot('tenants');
  });

  await step('tenants: suspend and reactivate one', async () => {
    await rowAction('Actions for tenant Globex Industries', 'Suspend');
    await dialog('Suspend this tenant?').getByRole('button', { name: 'Suspend', exact: true })
      .click();
    await sees('Tenant suspended');
    await eventually('globex is SUSPENDED', async () =>
      (await tenantStatus('globex')) === 'SUSPENDED');
    await sees('SUSPENDED');
    await rowAction('Actions for tenant Globex Industries', 'Reactivate');
    await dialog('Reactivate this tenant?').getByRole('button', { name: 'Reactivate', exact: true })
      .click();
    await sees('Tenant reactivated');
    await eventually('globex is ACTIVE again', async () =>
      (await tenantStatus('globex')) === 'ACTIVE');
  });

  await step('tenants: create one through the form', async () => {
    await page.getByRole('button', { name: 'Create Tenant', exact: true }).click();
    const form = dialog('Create Tenant');
    await form.locator('#ct-id').fill('umbrella');
    await form.locator('#ct-name').fill('Umbrella Labs');
    await form.getByRole('button', { name: 'Create Tenant', exact: true }).click();
    await sees("Tenant 'Umbrella Labs' created");
    const created = await api('GET', '/v1/admin/tenants/umbrella');
    if (created.name !== 'Umbrella Labs' || created.status !== 'ACTIVE') {
      throw new Error(`created tenant reads back as ${JSON.stringify(created)}`);
    }
    // The form opens the new tenant's page.
    await page.waitForURL('**/tenants/umbrella');
  });

  await step('tenant detail: a deep link to a tenant loads the app', async () => {
    const webhooks = page.waitForResponse((response) => {
      const url = new URL(response.url());
      return url.pathname === '/v1/admin/webhooks' && url.searchParams.get('tenant_id') === 'acme';
    });
    // A reload asks the server for /tenants/acme itself: the history-routing fallback.
    await page.goto('/tenants/acme');
    await heading('Tenant Detail');
    const name = page.getByRole('heading', { level: 2, name: 'Acme Corp', exact: true });
    const notFound = page.getByTestId('tenant-not-found');
    await name.or(notFound).first().waitFor();
    if (await notFound.isVisible()) {
      // The page loads the tenant's webhooks with everything else, and a 404 there reads as
      // "no such tenant". Accepted only while that call is a known gap.
      const answer = await webhooks;
      if (answer.ok() || !knownGap('GET', new URL(answer.url()))) {
        throw new Error('the tenant page says "Tenant not found" for a tenant that exists');
      }
      await sees('Tenant not found');
      blocked.push('Tenant detail shows "Tenant not found": its webhooks call is a known gap');
    } else {
      await sees('Spend rollup (ACTIVE budgets)');
      await sees('tenant:acme/workspace:prod');
    }
    await screenshot('tenant-detail');
  });

  let secret = '';
  await step('api keys: the seeded keys are listed', async () => {
    await navigate('API Keys', 'API Keys');
    await sees('acme-agent');
    await sees('globex-agent');
    await screenshot('api-keys');
  });

  await step('api keys: create one and see its secret once', async () => {
    await page.getByRole('button', { name: 'Create API Key', exact: true }).click();
    const form = dialog('Create API Key');
    await form.locator('#ck-tenant').selectOption('acme');
    await form.locator('#ck-name').fill('browser-key');
    await form.getByRole('button', { name: 'Create Key', exact: true }).click();
    const reveal = dialog('API Key Created');
    await sees('This secret will not be shown again. Copy it now.', reveal);
    secret = (await reveal.locator('code').innerText()).trim();
    if (!secret) throw new Error('no secret shown');
    // The secret shown is a working key of the tenant.
    await api('GET', '/v1/balances?tenant=acme', { key: secret });
    await reveal.getByRole('checkbox').check();
    await reveal.getByRole('button', { name: 'Close', exact: true }).click();
    await sees('browser-key');
    await screenshot('api-keys-created');
  });

  const keyNamed = async (name) =>
    (await api('GET', '/v1/admin/api-keys?tenant_id=acme')).keys.find((k) => k.name === name);

  await step('api keys: rename the new key', async () => {
    await rowAction('Actions for API key browser-key', 'Edit');
    const form = dialog('Edit API Key');
    await form.locator('#ek-name').fill('browser-key-renamed');
    await form.getByRole('button', { name: 'Save Changes', exact: true }).click();
    await sees('API key updated');
    await sees('browser-key-renamed');
    await eventually('the key is renamed', async () =>
      Boolean(await keyNamed('browser-key-renamed')));
  });

  await step('api keys: revoke it', async () => {
    await rowAction('Actions for API key browser-key-renamed', 'Revoke');
    await dialog('Revoke this API key?').getByRole('button', { name: 'Revoke Key', exact: true })
      .click();
    await sees('API key revoked');
    await eventually('the key is REVOKED', async () =>
      (await keyNamed('browser-key-renamed'))?.status === 'REVOKED');
    // Revoked keys are hidden until asked for.
    await page.getByRole('checkbox', { name: /^Show .* keys$/ }).check();
    await sees('REVOKED');
    // And the secret no longer works.
    const refused = await fetch(`${BASE}/v1/balances?tenant=acme`, {
      headers: { 'X-Cycles-API-Key': secret },
    });
    if (refused.status !== 401) throw new Error(`a revoked key answered ${refused.status}`);
  });

  await step('budgets: the seeded budgets are listed', async () => {
    await navigate('Budgets', 'Budgets');
    for (const [, scope] of budgets) await sees(scope);
    await screenshot('budgets');
  });

  await step('reservations: the seeded ACTIVE reservation is listed', async () => {
    await navigate('Reservations', 'Reservations');
    await page.locator('#res-tenant').selectOption('acme');
    await sees(reservationId);
    await sees('tenant:acme/workspace:prod');
    await screenshot('reservations');
  });

  await step('reservations: force release it', async () => {
    await rowAction(`Actions for reservation ${reservationId}`, 'Force release');
    await dialog('Force release this reservation?')
      .getByRole('button', { name: 'Force release', exact: true }).click();
    await sees(`Reservation ${reservationId} released`);
    await sees('No ACTIVE reservations for this tenant');
    const released = await api('GET', `/v1/reservations/${reservationId}`);
    if (released.status !== 'RELEASED') {
      throw new Error(`the reservation reads back as ${released.status}`);
    }
    await screenshot('reservations-released');
  });
}

async function main() {
  mkdirSync(SCREENSHOTS, { recursive: true });
  const profile = mkdtempSync(join(tmpdir(), 'cycles-dashboard-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
    baseURL: BASE,
    viewport: { width: 1440, height: 900 },
  });
  context.setDefaultTimeout(TIMEOUT_MS);
  let failed = false;
  try {
    page = context.pages()[0] || (await context.newPage());
    watch(page);
    await run();
  } catch (error) {
    failed = true;
    console.error(`\n${error.stack || error}`);
  } finally {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  }

  console.log('\nknown gaps (calls the server does not answer yet, KNOWN_GAPS):');
  if (gapsHit.size === 0) console.log('  none hit');
  for (const [seen, count] of gapsHit) console.log(`  ${seen} ×${count}`);
  for (const note of blocked) console.log(`  ${note}`);
  if (dashboardIssues.size > 0) {
    console.log('\nknown issues of the dashboard itself (console errors, not failed):');
    for (const issue of dashboardIssues) console.log(`  ${issue}`);
  }
  for (const left of provoked) {
    problems.push(`expected ${left.method} ${left.path} to answer ${left.status}; it did not`);
  }
  if (problems.length > 0) {
    console.log(`\n${problems.length} unexpected problem(s):`);
    for (const problem of problems) console.log(`  ${problem}`);
  }
  console.log(`\nscreenshots: ${SCREENSHOTS}`);
  if (failed || problems.length > 0) process.exit(1);
  console.log('dashboard: all steps passed');
}

await main();
