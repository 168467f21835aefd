// kafkajs (the Node client, pinned in package.json) against a running shardlog broker, at its default
// settings.
//
// Usage: node kafkajs_clients.js HOST:PORT
//
// Creates a topic through the admin API; produces with the default producer (acks=-1, not idempotent);
// a group of two consumers shares the topic's partitions, consumes every record once and commits (the
// default autoCommit commits after each batch); DescribeGroups shows the group Stable with two members,
// then Empty, of protocol type "consumer", once they leave. Then it prints "restart-broker" and waits for
// a line on stdin: the test restarts the broker meanwhile. After the restart the committed offsets are
// still there, the same producer produces again, and two new members start exactly at the committed
// offsets: they get the new records and none of the old. Exits non-zero with a message on the first
// mismatch; prints "kafkajs: all checks passed" at the end.

'use strict'

process.env.KAFKAJS_NO_PARTITIONER_WARNING = '1'
const readline = require('readline')
const { Kafka, logLevel } = require('kafkajs')

const BOOTSTRAP = process.argv[2]
const TOPIC = 'js-orders'
const GROUP = 'js-group'
const PARTITIONS = 4
const FIRST = 200
const SECOND = 100

function check(cond, message) {
  if (!cond) {
    console.error(`FAILED: ${message}`)
    process.exit(1)
  }
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))

async function until(what, seconds, condition) {
  const deadline = Date.now() + seconds * 1000
  while (Date.now() < deadline) {
    if (await condition()) return
    await sleep(200)
  }
  check(false, `${what} within ${seconds} s`)
}

const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]()

async function brokerRestarted() {
  console.log('restart-broker')
  const line = await lines.next()
  check(!line.done && line.value.trim() === 'restarted', `the test restarts the broker, said ${line.value}`)
}

// Default settings but for the log level: only errors, so the test's output stays readable.
const kafka = new Kafka({ clientId: 'shardlog-kafkajs', brokers: [BOOTSTRAP], logLevel: logLevel.ERROR })

async function produce(producer, from, count) {
  const messages = []
  for (let i = from; i < from + count; i++) {
    messages.push({ key: `k${i % 13}`, value: `v${i}` })
  }
  // kafkajs' default acks is -1 (all in-sync replicas).
  const acked = await producer.send({ topic: TOPIC, messages })
  check(acked.every(r => r.errorCode === 0), `produce acknowledged: ${JSON.stringify(acked)}`)
}

// Two members of GROUP consuming until `expected` records arrived; returns what each consumed.
async function consumeAsGroup(expected) {
  const seen = new Map() // "partition:offset" -> [member]
  const values = []
  const members = ['a', 'b'].map(name => ({ name, consumer: kafka.consumer({ groupId: GROUP }), assigned: [] }))
  for (const m of members) {
    m.consumer.on(m.consumer.events.GROUP_JOIN, e => {
      m.assigned = (e.payload.memberAssignment[TOPIC] || []).slice().sort()
    })
    await m.consumer.connect()
    // With no committed offset the group starts at the earliest record (kafkajs' default is the latest).
    await m.consumer.subscribe({ topics: [TOPIC], fromBeginning: true })
    await m.consumer.run({
      eachMessage: async ({ partition, message }) => {
        const key = `${partition}:${message.offset}`
        seen.set(key, (seen.get(key) || []).concat(m.name))
        values.push(message.value.toString())
      },
    })
  }
  await until(`${expected} records consumed by two members sharing the partitions`, 120, () =>
    seen.size >= expected &&
    members.every(m => m.assigned.length > 0) &&
    members.reduce((n, m) => n + m.assigned.length, 0) === PARTITIONS)
  return { members, seen, values }
}

// The group's committed offsets by partition; a partition without a commit (-1) counts as 0.
async function committed(admin) {
  const [topic] = await admin.fetchOffsets({ groupId: GROUP, topics: [TOPIC] })
  return Object.fromEntries(topic.partitions.map(p => [p.partition, Math.max(0, Number(p.offset))]))
}

async function describe(admin) {
  const { groups } = await admin.describeGroups([GROUP])
  check(groups.length === 1 && groups[0].errorCode === 0, `describeGroups: ${JSON.stringify(groups)}`)
  return groups[0]
}

async function main() {
  const admin = kafka.admin()
  await admin.connect()
  const created = await admin.createTopics({ topics: [{ topic: TOPIC, numPartitions: PARTITIONS }] })
  check(created === true, 'createTopics created the topic')
  const metadata = await admin.fetchTopicMetadata({ topics: [TOPIC] })
  check(metadata.topics[0].partitions.length === PARTITIONS, `the topic has ${PARTITIONS} partitions`)

  const producer = kafka.producer()
  await producer.connect()
  await produce(producer, 0, FIRST)

  const first = await consumeAsGroup(FIRST)
  check(first.seen.size === FIRST, `every record once: ${first.seen.size} of ${FIRST}`)
  check([...first.seen.values()].every(by => by.length === 1), 'no record consumed twice')
  const owned = first.members.flatMap(m => m.assigned)
  check(new Set(owned).size === PARTITIONS, `each partition has one member: ${JSON.stringify(owned)}`)
  await until('the consumed offsets committed', 30, async () =>
    Object.values(await committed(admin)).reduce((a, b) => a + b, 0) === FIRST)

  const stable = await describe(admin)
  check(stable.state === 'Stable' && stable.members.length === 2, `a stable group of two: ${stable.state}`)
  check(stable.protocolType === 'consumer', `protocol type: ${stable.protocolType}`)
  for (const m of first.members) await m.consumer.disconnect()
  const empty = await describe(admin)
  check(empty.state === 'Empty' && empty.members.length === 0, `empty once both left: ${empty.state}`)
  check(empty.protocolType === 'consumer', `an empty group keeps its protocol type: "${empty.protocolType}"`)
  const before = await committed(admin)

  await brokerRestarted()

  // The clients made before the restart find the broker again.
  await until('the committed offsets read after the restart', 60, async () => {
    try {
      return JSON.stringify(await committed(admin)) === JSON.stringify(before)
    } catch (e) {
      return false // the coordinator is still loading
    }
  })
  const reloaded = await describe(admin)
  check(reloaded.state === 'Empty' && reloaded.protocolType === 'consumer',
    `the group after the restart: ${reloaded.state} "${reloaded.protocolType}"`)
  await produce(producer, FIRST, SECOND)

  const second = await consumeAsGroup(SECOND)
  await sleep(2000) // anything consumed again would show up now
  check(second.seen.size === SECOND, `only the new records, once each: ${second.seen.size} of ${SECOND}`)
  check(second.values.every(v => Number(v.slice(1)) >= FIRST), 'the group resumed at its committed offsets')
  for (const m of second.members) await m.consumer.disconnect()
  await producer.disconnect()
  await admin.disconnect()
  console.log('kafkajs: all checks passed')
}

main().then(
  () => process.exit(0),
  e => {
    console.error(`FAILED: ${e.stack || e}`)
    process.exit(1)
  },
)
