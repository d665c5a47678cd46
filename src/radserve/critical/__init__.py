"""Critical findings pushed to webhook receivers through the durable outbox."""
