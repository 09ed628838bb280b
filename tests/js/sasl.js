// kafkajs logging in with SASL and producing: with MECHANISM (plain, scram-sha-256,
// scram-sha-512) as USERNAME/PASSWORD, one record VALUE is sent to TOPIC (partition 0).
// Prints one JSON object on its last line of standard output: {"sent": true}, or
// {"error": {"name", "message"}} when the login or the send failed; exits non-zero only
// on an unexpected failure or after DEADLINE_MS.
// Usage: node sasl.js BOOTSTRAP MECHANISM USERNAME PASSWORD TOPIC VALUE

'use strict'

const { createRequire } = require('module')
const path = require('path')

const peer = path.join(__dirname, '..', '..', 'peers', 'kafkajs', 'package.json')
const peerRequire = createRequire(peer)
const { Kafka, Partitioners, logLevel } = peerRequire('kafkajs')

const DEADLINE_MS = 60000
const [bootstrap, mechanism, username, password, topic, value] = process.argv.slice(2)

async function main () {
  const kafka = new Kafka({
    clientId: 'sasl-test',
    brokers: bootstrap.split(','),
    sasl: { mechanism, username, password },
    logLevel: logLevel.NOTHING,
    retry: { retries: 0 }
  })
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner })
  try {
    await producer.connect()
    await producer.send({ topic, acks: -1, messages: [{ value, partition: 0 }] })
    return { sent: true }
  } catch (e) {
    return { error: { name: e.name, message: e.message } }
  } finally {
    await producer.disconnect()
  }
}

const deadline = setTimeout(() => { console.error('deadline passed'); process.exit(2) }, DEADLINE_MS)
main().then(
  result => { clearTimeout(deadline); console.log(JSON.stringify(result)) },
  error => { console.error(error); process.exit(1) }
)
