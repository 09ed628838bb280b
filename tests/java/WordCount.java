// Kafka Streams' word count with a state store, run twice: creates INPUT and OUTPUT (two
// partitions each), sends the first half of LINES_FILE's lines, counts the words
// (groupBy, then count into an in-memory key-value store whose changelog topic Streams
// creates as it does by default, cleanup.policy=compact) until the output holds every
// count, stops, wipes the local state and starts again, so the second half is counted on
// top of counts restored from the store's changelog topic. The changelog rolls a segment
// every 100 ms and is cleaned past a dirty ratio of 1%; between the two runs the program
// waits until the broker's cleaner has removed records from it, so the second run
// restores from a cleaned changelog. Prints the changelog topic's cleanup.policy as the
// broker describes it ("changelog cleanup.policy VALUE"), its records and end offsets
// when it was found cleaned ("changelog cleaned RECORDS END"), and the final count of
// every word ("count WORD N"), the last value OUTPUT holds for it; exits non-zero if the
// output does not reach every count within a minute, or the changelog is not cleaned in 30 s.
// GUARANTEE is Streams' processing.guarantee (at_least_once, exactly_once_v2).
// Usage: java -cp 'JARS/*' WordCount.java BOOTSTRAP INPUT OUTPUT LINES_FILE STATE_DIR GUARANTEE
//
// Or only the count, with no input of its own, for tests that feed INPUT and read OUTPUT
// themselves (both must exist): runs until its standard input ends, then closes and
// prints "closed". Its internal topics (changelog, repartition) get REPLICATION replicas
// and min.insync.replicas=2 when there are more than two. Prints each state Streams
// enters ("state RUNNING") and any uncaught error ("error ...", after which it shuts down).
// Usage: java -cp 'JARS/*' WordCount.java serve BOOTSTRAP INPUT OUTPUT STATE_DIR GUARANTEE REPLICATION

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.LongDeserializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

public class WordCount {
    static final String STORE = "counts";

    public static void main(String[] args) throws Exception {
        if (args[0].equals("serve")) {
            serve(args[1], args[2], args[3], args[4], args[5], Integer.parseInt(args[6]));
            return;
        }
        String bootstrap = args[0], input = args[1], output = args[2];
        List<String> lines = Files.readAllLines(Path.of(args[3]));
        String stateDir = args[4], guarantee = args[5];
        String application = input + "-wordcount";
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            admin.createTopics(List.of(new NewTopic(input, 2, (short) 1), new NewTopic(output, 2, (short) 1)))
                .all().get();
            Topology topology = topology(input, output);
            Map<String, Long> counts = new TreeMap<>();
            try (KafkaConsumer<String, Long> consumer = outputConsumer(bootstrap, output)) {
                int half = lines.size() / 2;
                run(topology, streamsConfig(bootstrap, application, stateDir, guarantee),
                    lines.subList(0, half), bootstrap, input, consumer, counts, words(lines.subList(0, half)));
                awaitCleaned(bootstrap, application + "-" + STORE + "-changelog");
                run(topology, streamsConfig(bootstrap, application, stateDir, guarantee),
                    lines.subList(half, lines.size()), bootstrap, input, consumer, counts, words(lines));
            }
            String changelogTopic = application + "-" + STORE + "-changelog";
            var resource = new ConfigResource(ConfigResource.Type.TOPIC, changelogTopic);
            var config = admin.describeConfigs(List.of(resource)).all().get().get(resource);
            System.out.println("changelog cleanup.policy " + config.get("cleanup.policy").value());
            counts.forEach((word, count) -> System.out.println("count " + word + " " + count));
        }
    }

    static void serve(String bootstrap, String input, String output, String stateDir, String guarantee,
                      int replication) throws Exception {
        Properties config = streamsConfig(bootstrap, input + "-wordcount", stateDir, guarantee);
        config.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, replication);
        if (replication > 2) {
            config.put(StreamsConfig.topicPrefix("min.insync.replicas"), "2");
        }
        KafkaStreams streams = new KafkaStreams(topology(input, output), config);
        streams.setStateListener((state, previous) -> System.out.println("state " + state));
        streams.setUncaughtExceptionHandler(error -> {
            System.out.println("error " + error);
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.cleanUp();
        streams.start();
        try {
            while (System.in.read() != -1) {
                // Until the standard input ends.
            }
        } finally {
            streams.close(Duration.ofSeconds(60));
        }
        System.out.println("closed");
    }

    static Topology topology(String input, String output) {
        Materialized<String, Long, KeyValueStore<Bytes, byte[]>> materialized = Materialized
            .<String, Long>as(Stores.inMemoryKeyValueStore(STORE))
            .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long())
            .withLoggingEnabled(Map.of("segment.ms", "100", "min.cleanable.dirty.ratio", "0.01"));
        StreamsBuilder builder = new StreamsBuilder();
        builder.<String, String>stream(input)
            .flatMapValues(line -> Arrays.asList(line.toLowerCase().split("\\W+")))
            .filter((key, word) -> !word.isEmpty())
            .groupBy((key, word) -> word)
            .count(materialized)
            .toStream()
            .to(output, Produced.with(Serdes.String(), Serdes.Long()));
        return builder.build();
    }

    static Properties streamsConfig(String bootstrap, String application, String stateDir, String guarantee) {
        Properties config = new Properties();
        config.put(StreamsConfig.APPLICATION_ID_CONFIG, application);
        config.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        config.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        config.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        config.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        config.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        // Counts reach the output at each commit: commit often (at_least_once waits 30 s).
        config.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        // Every update to the changelog, none merged in Streams' cache, in small batches
        // (a segment rolls between batches): a log to clean.
        config.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        config.put(StreamsConfig.producerPrefix("batch.size"), 512);
        config.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        return config;
    }

    /** Sends `lines` to `input` with a fresh Streams instance running (its local state
     * wiped first, so it restores the store from the changelog), and reads the output
     * into `counts` until the counts add up to `total` words. */
    static void run(Topology topology, Properties config, List<String> lines, String bootstrap, String input,
                    KafkaConsumer<String, Long> consumer, Map<String, Long> counts, long total) throws Exception {
        KafkaStreams streams = new KafkaStreams(topology, config);
        try {
            streams.cleanUp();
            streams.start();
            send(bootstrap, input, lines);
            long deadline = System.currentTimeMillis() + 60_000;
            while (counts.values().stream().mapToLong(Long::longValue).sum() < total) {
                if (System.currentTimeMillis() > deadline || streams.state() == KafkaStreams.State.ERROR) {
                    throw new IllegalStateException("counts " + counts + " (state " + streams.state()
                        + ") do not add up to " + total + " words");
                }
                for (ConsumerRecord<String, Long> record : consumer.poll(Duration.ofMillis(200))) {
                    counts.put(record.key(), record.value());
                }
            }
        } finally {
            // Leave the group: the next instance is then assigned at once, not after this
            // member's session times out.
            streams.close(CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP));
        }
    }

    static long words(List<String> lines) {
        return lines.stream()
            .flatMap(line -> Arrays.stream(line.toLowerCase().split("\\W+")))
            .filter(word -> !word.isEmpty())
            .count();
    }

    static void send(String bootstrap, String topic, List<String> lines) throws Exception {
        Properties config = new Properties();
        config.put("bootstrap.servers", bootstrap);
        config.put("key.serializer", StringSerializer.class.getName());
        config.put("value.serializer", StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(config)) {
            // Lines 10 ms apart in event time, which the changelog's records carry: its
            // segments roll by segment.ms on those timestamps.
            long start = System.currentTimeMillis() - 10L * lines.size();
            for (int i = 0; i < lines.size(); i++) {
                producer.send(new ProducerRecord<>(topic, null, start + 10L * i, null, lines.get(i)));
            }
            producer.flush();
        }
    }

    /** Waits until the changelog holds fewer records than its offsets span (the cleaner
     * removed some), and prints both. */
    static void awaitCleaned(String bootstrap, String changelog) throws Exception {
        Properties config = new Properties();
        config.put("bootstrap.servers", bootstrap);
        config.put("key.deserializer", ByteArrayDeserializer.class.getName());
        config.put("value.deserializer", ByteArrayDeserializer.class.getName());
        var partitions = List.of(new TopicPartition(changelog, 0), new TopicPartition(changelog, 1));
        long deadline = System.currentTimeMillis() + 30_000;
        try (var consumer = new KafkaConsumer<byte[], byte[]>(config)) {
            consumer.assign(partitions);
            while (true) {
                long end = consumer.endOffsets(partitions).values().stream().mapToLong(Long::longValue).sum();
                consumer.seekToBeginning(partitions);
                long records = 0;
                while (partitions.stream().mapToLong(consumer::position).sum() < end) {
                    records += consumer.poll(Duration.ofMillis(200)).count();
                }
                if (records < end) {
                    System.out.println("changelog cleaned " + records + " " + end);
                    return;
                }
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException(changelog + ": not cleaned in 30 s (" + records + " records)");
                }
                Thread.sleep(200);
            }
        }
    }

    static KafkaConsumer<String, Long> outputConsumer(String bootstrap, String output) {
        Properties config = new Properties();
        config.put("bootstrap.servers", bootstrap);
        config.put("key.deserializer", StringDeserializer.class.getName());
        config.put("value.deserializer", LongDeserializer.class.getName());
        config.put("isolation.level", "read_committed");
        var consumer = new KafkaConsumer<String, Long>(config);
        var partitions = List.of(new TopicPartition(output, 0), new TopicPartition(output, 1));
        consumer.assign(partitions);
        consumer.seekToBeginning(partitions);
        return consumer;
    }
}
