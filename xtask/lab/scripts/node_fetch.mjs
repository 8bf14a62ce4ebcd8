// Node's fetch (undici, keep-alive by default) in a loop in one process: prints how many
// answers each pod gave, as JSON.
const [url, countArg] = process.argv.slice(2);
const counts = {};
for (let i = 0; i < Number(countArg); i++) {
  const res = await fetch(url);
  const body = await res.text();
  counts[body] = (counts[body] ?? 0) + 1;
}
console.log(JSON.stringify(counts));
// Idle keep-alive sockets would hold the process for undici's keep-alive timeout.
process.exit(0);
