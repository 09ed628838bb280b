// kafkajs's transactions against a Kafka-protocol broker, in the order a test can check:
// a transactional producer commits COMMITTED records and aborts ABORTED ones on TOPIC
// (partition 0); then, consume-transform-produce, a consumer in GROUP reads INPUT's
// records and for each one a transaction writes "out-VALUE" to TOPIC and sends the
// consumed offset (+1) to GROUP (sendOffsets), the group's committed offset fetched just
// before the last commit and after it; then, with a transaction of the first producer
// open ("zombie" sent), a second producer with the same transactional id starts, after
// which the first one's send and commit fail; the second commits "successor", the last
// record. Then a read_committed and a read_uncommitted consumer read TOPIC from its start
// up to "successor".
// Prints one JSON object on its last line of standard output; the client's log goes to
// standard error. Exits non-zero on any other failure, or after DEADLINE_MS.
// Usage: node transactions.js BOOTSTRAP TOPIC INPUT INPUT_RECORDS GROUP TRANSACTIONAL_ID

'use strict'

const { createRequire } = require('module')
const path = require('path')

const peer = path.join(__dirname, '..', '..', 'peers', 'kafkajs', 'package.json')
const peerRequire = createRequire(peer)
const { Kafka, Partitioners, logLevel } = peerRequire('kafkajs')
const KAFKAJS_VERSION = peerRequire('kafkajs/package.json').version

const COMMITTED = ['c0', 'c1', 'c2', 'c3', 'c4']
const ABORTED = ['a0', 'a1', 'a2']
const LAST = 'successor'
const DEADLINE_MS = 60000

const [bootstrap, topic, input, inputRecords, group, transactionalId] = process.argv.slice(2)

const kafka = new Kafka({
  clientId: 'tierbroker-kafkajs-transactions',
  brokers: bootstrap.split(','),
  logLevel: logLevel.INFO,
  logCreator: () => ({ namespace, label, log }) => {
    process.stderr.write(`${label} [${namespace}] ${JSON.stringify(log)}\n`)
  },
  retry: { retries: 10, initialRetryTime: 100, maxRetryTime: 1000 },
})

let step = 'starting'

function producer () {
  return kafka.producer({
    transactionalId,
    idempotent: true,
    maxInFlightRequests: 1,
    transactionTimeout: 30000,
    createPartitioner: Partitioners.DefaultPartitioner,
  })
}

// A consumer's fetchers for brokers leading none of its partitions sleep the fetch's
// maximum wait, and stopping the consumer waits for them: 500 ms, as Kafka's default.
function groupConsumer (options) {
  return kafka.consumer({ ...options, maxWaitTimeInMs: 500 })
}

function describe (error) {
  const seen = {
    name: error.name,
    type: error.type ?? null,
    code: error.code ?? null,
    retriable: error.retriable ?? null,
    message: error.message,
  }
  const cause = error.originalError ?? error.cause
  if (cause && cause !== error) seen.cause = describe(cause)
  return seen
}

async function failure (promise) {
  try {
    await promise
  } catch (error) {
    return describe(error)
  }
  return null
}

function send (transaction, values) {
  return transaction.send({ topic, messages: values.map(value => ({ value, partition: 0 })) })
}

async function groupOffset (admin) {
  const [fetched] = await admin.fetchOffsets({ groupId: group, topics: [input] })
  return fetched.partitions.find(p => p.partition === 0).offset
}

async function transform (first, admin) {
  const consumer = groupConsumer({ groupId: group, readUncommitted: false })
  await consumer.connect()
  await consumer.subscribe({ topic: input, fromBeginning: true })
  const seen = { offsets: [], pending_offset: null }
  let finish
  const finished = new Promise((resolve, reject) => { finish = { resolve, reject } })
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ partition, message }) => {
      try {
        const transaction = await first.transaction()
        await send(transaction, [`out-${message.value}`])
        const next = (BigInt(message.offset) + 1n).toString()
        await transaction.sendOffsets({
          consumerGroupId: group,
          topics: [{ topic: input, partitions: [{ partition, offset: next }] }],
        })
        seen.offsets.push(message.offset)
        const last = seen.offsets.length === Number(inputRecords)
        if (last) seen.pending_offset = await groupOffset(admin)
        await transaction.commit()
        if (last) finish.resolve()
      } catch (error) {
        finish.reject(error)
        throw error
      }
    },
  })
  await finished
  await consumer.disconnect()
  seen.committed_offset = await groupOffset(admin)
  return seen
}

async function read (readUncommitted) {
  const name = readUncommitted ? 'uncommitted' : 'committed'
  const consumer = groupConsumer({ groupId: `${group}-${name}-reader`, readUncommitted })
  await consumer.connect()
  await consumer.subscribe({ topic, fromBeginning: true })
  const records = []
  let done
  const reachedLast = new Promise(resolve => { done = resolve })
  await consumer.run({
    eachMessage: async ({ message }) => {
      const value = message.value.toString()
      records.push({ offset: Number(message.offset), value })
      if (value === LAST) done()
    },
  })
  await reachedLast
  await consumer.disconnect()
  return records
}

async function main () {
  const result = { kafkajs_version: KAFKAJS_VERSION }
  const admin = kafka.admin()
  await admin.connect()

  step = 'committing and aborting'
  const first = producer()
  await first.connect()
  const committed = await first.transaction()
  await send(committed, COMMITTED)
  await committed.commit()
  const aborted = await first.transaction()
  await send(aborted, ABORTED)
  await aborted.abort()

  step = 'consume-transform-produce'
  result.transform = await transform(first, admin)

  step = 'fencing'
  const zombie = await first.transaction()
  await send(zombie, ['zombie'])
  const second = producer()
  await second.connect()
  const successor = await second.transaction()
  result.fenced_send = await failure(send(zombie, ['zombie-after-fencing']))
  result.fenced_commit = await failure(zombie.commit())
  await send(successor, [LAST])
  result.successor_commit = await failure(successor.commit())

  step = 'reading read_committed'
  result.read_committed = await read(false)
  step = 'reading read_uncommitted'
  result.read_uncommitted = await read(true)

  await Promise.all([first.disconnect(), second.disconnect(), admin.disconnect()])
  return result
}

const timer = setTimeout(() => {
  process.stderr.write(`timed out after ${DEADLINE_MS} ms ${step}\n`)
  process.exit(2)
}, DEADLINE_MS)

main().then(result => {
  clearTimeout(timer)
  process.stdout.write(JSON.stringify(result) + '\n')
  process.exit(0)
}, error => {
  process.stderr.write(`failed ${step}: ${error.stack}\n${JSON.stringify(describe(error))}\n`)
  process.exit(1)
})
