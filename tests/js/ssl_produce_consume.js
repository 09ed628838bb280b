// kafkajs over TLS: produces COUNT records to TOPIC (created with one partition), then a
// consumer reads them back from the start. CA is the PEM file of the CA to trust; CERT and
// KEY, if given, the client's certificate and key (mutual TLS). The broker's host name is
// checked, as kafkajs does by default.
// Prints one JSON object on its last line of standard output ({"produced": n, "values":
// [...]}); the client's log goes to standard error. Exits non-zero on any failure, or
// after DEADLINE_MS.
// Usage: node ssl_produce_consume.js BOOTSTRAP TOPIC COUNT CA [CERT KEY]

'use strict'

const { createRequire } = require('module')
const fs = require('fs')
const path = require('path')

const peer = path.join(__dirname, '..', '..', 'peers', 'kafkajs', 'package.json')
const { Kafka, Partitioners, logLevel } = createRequire(peer)('kafkajs')

const DEADLINE_MS = 60000
const [bootstrap, topic, count, ca, cert, key] = process.argv.slice(2)

const ssl = { ca: [fs.readFileSync(ca, 'utf-8')] }
if (cert) {
  ssl.cert = fs.readFileSync(cert, 'utf-8')
  ssl.key = fs.readFileSync(key, 'utf-8')
}
const kafka = new Kafka({
  clientId: 'tierbroker-kafkajs-ssl',
  brokers: bootstrap.split(','),
  ssl,
  logLevel: logLevel.WARN,
  logCreator: () => ({ namespace, label, log }) => {
    process.stderr.write(`${label} [${namespace}] ${JSON.stringify(log)}\n`)
  },
  retry: { retries: 3, initialRetryTime: 100, maxRetryTime: 1000 },
})

async function main () {
  const admin = kafka.admin()
  await admin.connect()
  await admin.createTopics({ topics: [{ topic, numPartitions: 1, replicationFactor: 1 }], waitForLeaders: true })
  await admin.disconnect()

  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner })
  await producer.connect()
  const messages = Array.from({ length: Number(count) }, (_, i) => ({ value: `v${i}` }))
  await producer.send({ topic, messages })
  await producer.disconnect()

  const consumer = kafka.consumer({ groupId: `${topic}-group` })
  await consumer.connect()
  await consumer.subscribe({ topic, fromBeginning: true })
  const values = []
  await new Promise((resolve, reject) => {
    consumer.run({
      eachMessage: async ({ message }) => {
        values.push(message.value.toString())
        if (values.length === Number(count)) resolve()
      }
    }).catch(reject)
  })
  await consumer.disconnect()
  process.stdout.write(JSON.stringify({ produced: messages.length, values }) + '\n')
}

const deadline = setTimeout(() => {
  process.stderr.write(`no result after ${DEADLINE_MS} ms\n`)
  process.exit(2)
}, DEADLINE_MS)
main().then(() => clearTimeout(deadline)).catch((e) => {
  process.stderr.write(`${e.stack}\n`)
  process.exit(1)
})
