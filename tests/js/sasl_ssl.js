// kafkajs over SASL_SSL: logs in with MECHANISM (plain, scram-sha-512, or oauthbearer with
// an unsecured JWS whose subject is USERNAME, made by its oauthBearerProvider), trusting
// the CA in the PEM file CA (the broker's host name checked, as kafkajs does by default),
// produces COUNT records to partition 0 of TOPIC, then reads them back in a consumer group.
// Prints one JSON object on its last line of standard output: {"values": [...]}, or
// {"error": {"name", "message"}} when the login, the handshake or a request failed; exits
// non-zero only on an unexpected failure or after DEADLINE_MS.
// Usage: node sasl_ssl.js BOOTSTRAP CA MECHANISM USERNAME PASSWORD TOPIC COUNT

'use strict'

const { createRequire } = require('module')
const fs = require('fs')
const path = require('path')

const peer = path.join(__dirname, '..', '..', 'peers', 'kafkajs', 'package.json')
const { Kafka, Partitioners, logLevel } = createRequire(peer)('kafkajs')

const DEADLINE_MS = 60000
const [bootstrap, ca, mechanism, username, password, topic, count] = process.argv.slice(2)

// Kafka's unsecured JWS (alg "none", no signature), as its unsecured login module makes.
function unsecuredJws (subject) {
  const encode = (value) => Buffer.from(JSON.stringify(value)).toString('base64url')
  const now = Math.floor(Date.now() / 1000)
  return `${encode({ alg: 'none' })}.${encode({ sub: subject, iat: now, exp: now + 3600 })}.`
}

const sasl = mechanism === 'oauthbearer'
  ? { mechanism, oauthBearerProvider: async () => ({ value: unsecuredJws(username) }) }
  : { mechanism, username, password }
const kafka = new Kafka({
  clientId: 'tierbroker-kafkajs-sasl-ssl',
  brokers: bootstrap.split(','),
  ssl: { ca: [fs.readFileSync(ca, 'utf-8')] },
  sasl,
  logLevel: logLevel.NOTHING,
  // One retry: a refused login or handshake is reported within seconds.
  retry: { retries: 1, initialRetryTime: 100, maxRetryTime: 500 },
})

async function roundTrip () {
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner })
  await producer.connect()
  try {
    const messages = Array.from({ length: Number(count) }, (_, i) => ({ value: `v${i}`, partition: 0 }))
    await producer.send({ topic, acks: -1, messages })
  } finally {
    await producer.disconnect()
  }
  const consumer = kafka.consumer({ groupId: `${topic}-group` })
  await consumer.connect()
  try {
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
    return { values }
  } finally {
    await consumer.disconnect()
  }
}

async function main () {
  try {
    return await roundTrip()
  } catch (e) {
    return { error: { name: e.name, message: e.message } }
  }
}

const deadline = setTimeout(() => { console.error('deadline passed'); process.exit(2) }, DEADLINE_MS)
main().then(
  result => { clearTimeout(deadline); console.log(JSON.stringify(result)) },
  error => { console.error(error); process.exit(1) }
)
