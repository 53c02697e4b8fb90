// The console in a real browser: Debian's chromium driven by playwright-core,
// axe-core on every page (no serious or critical violation allowed).
// Run by scripts/console-e2e.sh, which starts sendonce and the mock provider
// and passes BASE, KEY, KEY2, RETRIED, VER, ARABIC, ZONE_OFFSET_HOURS,
// CHROMIUM and SHOTS.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { chromium } from 'playwright-core';

const require = createRequire(import.meta.url);
const axeSource = readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');
const { BASE, KEY, KEY2, RETRIED, VER, ARABIC, ZONE_OFFSET_HOURS, CHROMIUM, SHOTS } = process.env;
for (const [name, value] of Object.entries({ BASE, KEY, KEY2, RETRIED, VER, ARABIC, ZONE_OFFSET_HOURS, CHROMIUM, SHOTS })) {
  if (!value) throw new Error(`${name} is not set`);
}

let failures = 0;
function check(ok, what) {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) failures += 1;
}

/** Screenshot and accessibility check of the page as it is now. */
async function inspect(page, name) {
  await page.screenshot({ path: `${SHOTS}/${name}.png`, fullPage: true });
  // Evaluated through the DevTools protocol: the page's own policy forbids
  // every script, and stays in force for the page itself.
  await page.evaluate(axeSource);
  const result = await page.evaluate(() => window.axe.run(document, { resultTypes: ['violations'] }));
  const bad = result.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
  for (const v of bad) {
    console.log(`  axe ${v.impact}: ${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`);
  }
  const minor = result.violations.length - bad.length;
  check(result.passes.length > 0, `${name}: axe ran (${result.passes.length} rules passed)`);
  check(bad.length === 0, `${name}: no serious or critical axe violations${minor ? ` (${minor} minor)` : ''}`);
}

const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] });
try {
  const context = await browser.newContext({ viewport: { width: 1100, height: 800 } });
  const page = await context.newPage();
  const cspViolations = [];
  page.on('console', (msg) => {
    if (/Content Security Policy|Refused to/i.test(msg.text())) cspViolations.push(msg.text());
  });

  // Sign in.
  await page.goto(`${BASE}/console`);
  check(page.url().endsWith('/console/login'), 'the console sends a stranger to sign in');
  const csp = (await page.request.get(`${BASE}/console/login`)).headers()['content-security-policy'] ?? '';
  check(csp.includes("default-src 'none'") && !csp.includes('unsafe-inline'), `strict CSP: ${csp}`);
  await inspect(page, '01-login');
  await page.fill('#api_key', 'so_wrong-key-0000000000000000000');
  await page.click('button[type=submit]');
  check((await page.textContent('body')).includes('not accepted'), 'a wrong key is refused');
  await page.fill('#api_key', KEY);
  await Promise.all([page.waitForURL('**/console/overview'), page.click('main button[type=submit]')]);
  check(true, 'signed in');
  const headerBg = await page.$eval('header', (h) => getComputedStyle(h).backgroundColor);
  check(headerBg === 'rgb(246, 248, 250)', `the stylesheet applies under the CSP (${headerBg})`);
  check((await page.$('svg.chart')) !== null, 'the overview draws its chart');
  await inspect(page, '02-overview');

  // Search a key: straight to its timeline.
  await page.click('text=Find a message');
  await page.fill('#q', RETRIED);
  await Promise.all([page.waitForURL('**/console/messages/msg_*'), page.click('main button[type=submit]')]);
  const timelineUrl = page.url();
  const body = await page.textContent('main');
  for (const needle of ['Attempt 1 to http', 'Attempt 2 to http', 'Retried: attempt 2 started at', 'Receipt from http: delivered', 'the carrier reported it delivered']) {
    check(body.includes(needle), `the timeline shows "${needle}"`);
  }
  check(!/4815\d\d/.test(body), 'the one-time code is masked');
  await inspect(page, '03-timeline');
  // The picture in the README and docs/console.md (docs/console.png): the top
  // of a timeline, small.
  await page.setViewportSize({ width: 900, height: 640 });
  await page.screenshot({ path: `${SHOTS}/readme-timeline.png` });
  // On a phone (390 px wide) the timeline, webhook table included, fits:
  // nothing scrolls sideways, neither the page nor the table's wrapper.
  await page.setViewportSize({ width: 390, height: 844 });
  check(body.includes('Webhook deliveries'), 'the timeline lists webhook deliveries');
  const fit = await page.evaluate(() => {
    const wrap = [...document.querySelectorAll('.table-wrap')].find((w) => w.textContent.includes('/hooks/'));
    return {
      page: document.documentElement.scrollWidth,
      view: window.innerWidth,
      table: wrap ? wrap.scrollWidth - wrap.clientWidth : -1,
    };
  });
  check(fit.page <= fit.view, `at 390 px the timeline does not scroll sideways (${fit.page} <= ${fit.view})`);
  check(fit.table === 0, `at 390 px the webhook table fits its column (overflow ${fit.table} px)`);
  await inspect(page, '03-timeline-390px');
  await page.setViewportSize({ width: 1100, height: 800 });

  // Search a phone number: its messages, newest first.
  await page.goto(`${BASE}/console/search?q=${encodeURIComponent('+14155550100')}`);
  check((await page.$$('main table tbody tr')).length >= 1, 'a phone number lists its messages');
  await inspect(page, '04-search-by-number');

  // A verification, found by its id.
  await page.goto(`${BASE}/console/search?q=${VER}`);
  check(page.url().endsWith(`/console/verifications/${VER}`), 'a verification id opens its page');
  check((await page.textContent('main')).includes('******'), 'its text shows the code masked');
  await inspect(page, '05-verification');

  // Add and remove an opt-out.
  await page.click('text=Opt-outs');
  await page.fill('#number', '+1 415 555 0188');
  await page.click('text=Add to opt-outs');
  check((await page.textContent('main')).includes('was added'), 'an opt-out is added');
  check((await page.$('button[aria-label="Remove +14155550188"]')) !== null, 'it is listed');
  await inspect(page, '06-opt-outs');
  await page.click('button[aria-label="Remove +14155550188"]');
  check((await page.textContent('main')).includes('was removed'), 'an opt-out is removed');
  check((await page.$('button[aria-label="Remove +14155550188"]')) === null, 'it is gone');

  // Posts without the CSRF token are refused (with the session's cookie).
  for (const path of ['/console/opt-outs', '/console/opt-outs/remove', '/console/logout']) {
    const r = await page.request.post(`${BASE}${path}`, { form: { number: '+14155550189' }, maxRedirects: 0 });
    check(r.status() === 403, `a CSRF-less POST ${path} is refused (${r.status()})`);
  }
  const forged = await page.request.post(`${BASE}/console/opt-outs`, { form: { number: '+14155550189', csrf: 'forged' }, maxRedirects: 0 });
  check(forged.status() === 403, 'a forged CSRF token is refused');
  await page.goto(`${BASE}/console/opt-outs`);
  check(!(await page.textContent('main')).includes('+14155550189'), 'refused posts changed nothing');

  // A second tenant cannot open the first's timeline by its URL.
  const other = await browser.newContext();
  const page2 = await other.newPage();
  await page2.goto(`${BASE}/console/login`);
  await page2.fill('#api_key', KEY2);
  await Promise.all([page2.waitForURL('**/console/overview'), page2.click('main button[type=submit]')]);
  const resp = await page2.goto(timelineUrl);
  check(resp.status() === 404, `another tenant gets 404 for the timeline (${resp.status()})`);
  check(!(await page2.textContent('body')).includes(RETRIED), 'and sees nothing of it');
  await inspect(page2, '07-not-found-for-another-tenant');
  await other.close();

  // Issue 42, item 5: an Arabic body, on a phone (390 px) and a desktop
  // (1280 px), with the tenant's home country set (times in its zone).
  await page.goto(`${BASE}/console/search?q=${encodeURIComponent(ARABIC)}`);
  await page.waitForURL('**/console/messages/msg_*');
  const arabicUrl = page.url();
  const number = (await page.textContent('dl.facts')).match(/\+966\d+/)?.[0] ?? '';
  check(number !== '', `the Arabic message's number is shown (${number})`);
  const pages = [
    ['arabic-timeline', arabicUrl],
    ['arabic-search-by-number', `${BASE}/console/search?q=${encodeURIComponent(number)}`],
    ['arabic-search-by-key', `${BASE}/console/search?q=${encodeURIComponent('E2E-')}`],
    ['arabic-overview', `${BASE}/console/overview`],
    ['routes', `${BASE}/console/routes`],
  ];
  for (const width of [390, 1280]) {
    await page.setViewportSize({ width, height: 844 });
    for (const [name, url] of pages) {
      await page.goto(url);
      const at = `${name} at ${width} px`;
      const layout = await page.evaluate(() => {
        const wraps = [...document.querySelectorAll('.table-wrap')];
        const rows = [...document.querySelectorAll('main table.stack tbody tr')];
        return {
          page: document.documentElement.scrollWidth,
          view: document.documentElement.clientWidth,
          wrapsOver: wraps.map((w) => w.scrollWidth - w.clientWidth).filter((d) => d > 0),
          tables: wraps.length,
          rowDisplays: [...new Set(rows.map((r) => getComputedStyle(r).display))],
          rows: rows.length,
        };
      });
      check(layout.page <= layout.view, `${at}: the page does not scroll sideways (${layout.page} <= ${layout.view})`);
      check(layout.wrapsOver.length === 0, `${at}: no table overflows its column (${layout.wrapsOver.join(', ') || 'none'})`);
      // No word broken across lines in a table, except in cells of
      // unbounded unbroken text (class "long": URLs, idempotency keys); on a
      // phone no stacked cell's column name (its ::before) wraps.
      const broken = await page.evaluate(() => {
        const out = [];
        for (const cell of document.querySelectorAll('main table td, main table tbody th')) {
          const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
          for (let n = walker.nextNode(); n; n = walker.nextNode()) {
            if (n.parentElement.closest('.long')) continue;
            for (const m of n.data.matchAll(/\S+/g)) {
              const r = document.createRange();
              r.setStart(n, m.index);
              r.setEnd(n, m.index + m[0].length);
              const lines = new Set([...r.getClientRects()].map((x) => Math.round(x.top)));
              if (lines.size > 1) out.push(m[0]);
            }
          }
        }
        for (const td of document.querySelectorAll('main table.stack td')) {
          const label = getComputedStyle(td, '::before');
          if (label.content === 'none' || label.content === 'normal') continue;
          if (parseFloat(label.height) > 1.5 * parseFloat(getComputedStyle(td).lineHeight)) {
            out.push(`label ${td.dataset.label} (${label.height})`);
          }
        }
        return out;
      });
      check(broken.length === 0, `${at}: no word in a table is broken across lines${broken.length ? `: ${[...new Set(broken)].join(', ')}` : ''}`);
      if (name !== 'arabic-timeline') {
        check(layout.rows > 0, `${at}: the page has table rows (${layout.rows})`);
        const want = width === 390 ? 'block' : 'table-row';
        check(layout.rowDisplays.length === 1 && layout.rowDisplays[0] === want,
          `${at}: its table rows are ${want === 'block' ? 'stacked' : 'table rows'} (${layout.rowDisplays.join(', ')})`);
      }
      // Every time in the tenant's zone (UTC+ZONE_OFFSET_HOURS), its UTC
      // time on hover, the same instant.
      const times = await page.$$eval('main time', (ts) => ts.map((t) => ({
        text: t.textContent, title: t.getAttribute('title'), datetime: t.getAttribute('datetime'),
      })));
      const wrong = times.filter(({ text, title, datetime }) => {
        const local = text.match(/^(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d) ([+-]\d\d)$/);
        const utc = (title ?? '').match(/^(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d) UTC$/);
        if (!local || !utc || Number(local[3]) !== Number(ZONE_OFFSET_HOURS)) return true;
        const l = Date.parse(`${local[1]}T${local[2]}Z`) - Number(local[3]) * 3600e3;
        const u = Date.parse(`${utc[1]}T${utc[2]}Z`);
        return l !== u || Math.abs(Date.parse(datetime) - u) >= 1000;
      });
      if (name !== 'arabic-overview') check(times.length > 0, `${at}: times are shown (${times.length})`);
      check(wrong.length === 0, `${at}: every time is in the tenant's zone with UTC on hover${wrong.length ? `: ${JSON.stringify(wrong.slice(0, 3))}` : ''}`);
      if (name === 'arabic-timeline') {
        const body = await page.$eval('pre.body', (pre) => {
          const style = getComputedStyle(pre);
          const box = pre.getBoundingClientRect();
          const range = document.createRange();
          range.selectNodeContents(pre);
          const text = range.getBoundingClientRect();
          return {
            dir: pre.getAttribute('dir'),
            direction: style.direction,
            text: pre.textContent,
            // The text's right edge against the content box's.
            gapRight: box.right - parseFloat(style.borderRightWidth) - parseFloat(style.paddingRight) - text.right,
            gapLeft: text.left - box.left - parseFloat(style.borderLeftWidth) - parseFloat(style.paddingLeft),
          };
        });
        check(body.text.includes('شكراً'), `${at}: the body is the Arabic text (${body.text})`);
        check(body.dir === 'auto', `${at}: the body has dir="auto" (${body.dir})`);
        check(body.direction === 'rtl', `${at}: the body renders right to left (direction ${body.direction})`);
        check(Math.abs(body.gapRight) <= 2 && body.gapLeft > 20,
          `${at}: the Arabic text sits at the right of its box (gap right ${body.gapRight.toFixed(1)} px, left ${body.gapLeft.toFixed(1)} px)`);
      }
      await inspect(page, `${name}-${width}px`);
    }
  }
  await page.setViewportSize({ width: 1100, height: 800 });

  // Sign out.
  await Promise.all([page.waitForURL('**/console/login'), page.click('text=Sign out')]);
  await page.goto(`${BASE}/console/overview`);
  check(page.url().endsWith('/console/login'), 'signed out: the overview asks to sign in again');

  check(cspViolations.length === 0, `no CSP violation reported by the browser${cspViolations.length ? `: ${cspViolations.join(' | ')}` : ''}`);
} finally {
  await browser.close();
}
if (failures > 0) {
  console.error(`console-e2e: ${failures} check(s) failed`);
  process.exit(1);
}
console.log(`console-e2e: all checks passed; screenshots in ${SHOTS}`);
